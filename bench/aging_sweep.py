"""Where aging's knobs put a policy on the mean / p99 JCT plane, against FCFS, in the simulator.

    python -m bench.aging_sweep "ssjf:slowdown=6,lookahead=1" "ssjf:promote_after_s=1"

Each argument is POLICY[:KEY=VALUE,...] with keys of [scheduler.aging] (others default to
absolute-only aging: slowdown 0, no preemption, no look-ahead, so each knob is seen alone).
The workload is issue 10's: 1,500 first turns of the ShareGPT dev hold-out (never trained
on), bursty Gamma arrivals (CV 2.5) at RATE req/s (12: FCFS's mean JCT ~3x unloaded),
outputs x 0.25 capped at 256, the tiny-llama stack profile, 1 executor x 4 slots, the
shipped predictor. (A stop-gap until `lengthwise sim --set` lands: the same real core and
policies, on SimExecutor in virtual time.)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import msgspec
import numpy as np

from bench import sim, workload
from daemon.config import AgingConfig, Config, SchedulerConfig

ROOT = Path(__file__).resolve().parents[1]
DEV_FIRST = ROOT / "out" / "dev_first_turns.jsonl"
ABSOLUTE_ONLY = AgingConfig(slowdown=0.0, preempt=False, lookahead=False)


def dev_first_turns() -> str:
    """records:PATH of the dev hold-out's first answered turns (written once)."""
    if not DEV_FIRST.exists():
        from predictor.outtok import TokenCounter
        from predictor.sharegpt import iter_conversations, load_sharegpt_text, turns_of
        from predictor.split import Split, is_dev, split_of

        rows = []
        for conv in iter_conversations(load_sharegpt_text()):
            cid = conv.get("id")
            if isinstance(cid, str) and split_of(cid) is Split.TRAIN and is_dev(cid):
                for messages, response, _ in turns_of(conv):
                    rows.append(([{"role": m.role, "content": m.content} for m in messages],
                                 response))
                    break
        counts = TokenCounter(workload.DEFAULT_TOKENIZER).count_batch([r for _, r in rows])
        DEV_FIRST.parent.mkdir(parents=True, exist_ok=True)
        DEV_FIRST.write_bytes(b"".join(
            msgspec.json.encode({"messages": m, "output_tokens": float(n)}) + b"\n"
            for (m, _), n in zip(rows, counts, strict=True)))
    return f"records:{DEV_FIRST}"


def run(reqs: list[workload.Request], preds: list[float | None], policy: str,
        aging: AgingConfig) -> tuple[float, float]:
    profile = sim.load_sim_config(ROOT / "bench" / "profiles" / "tiny-llama-cpu-stack.json")
    config = Config(scheduler=SchedulerConfig(policy=policy, max_running=4, max_waiting=10**9,
                                              aging=aging), sim=profile)
    sim.make_config = lambda _: config  # this run's aging, not SimOptions' absolute one
    results = sim.simulate(reqs, preds, sim.SimOptions(policy=policy, sim=profile))
    jct = np.array([r.jct_s for r in results])
    return float(jct.mean()), float(np.percentile(jct, 99))


def main(argv: list[str]) -> int:
    rate = float(os.environ.get("RATE", "12"))
    spec = workload.WorkloadSpec(arrivals="gamma", cv=2.5, rate=rate, num=1500, scale=0.25,
                                 cap=256, lengths=dev_first_turns())
    reqs = workload.build(spec)
    preds = sim.predictions(reqs, str(ROOT / "predictor" / "models" / "default"), 0)
    base = run(reqs, preds, "fcfs", ABSOLUTE_ONLY)
    print(f"fcfs: mean {base[0]:.3f} s, p99 {base[1]:.3f} s")
    for arg in argv:
        policy, _, rest = arg.partition(":")
        fields = {}
        for item in filter(None, rest.split(",")):
            key, value = item.split("=")
            fields[key] = value in ("1", "true") if key in ("preempt", "lookahead") else float(
                value)
        mean, p99 = run(reqs, preds, policy, msgspec.structs.replace(ABSOLUTE_ONLY, **fields))
        print(f"{arg:48s} mean {mean / base[0]:.3f}x  p99 {p99 / base[1]:.3f}x  "
              f"({mean:.3f} / {p99:.3f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
