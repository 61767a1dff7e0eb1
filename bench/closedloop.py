"""The engines' own step at one fixed batch, each system started alone in turn: N closed-loop
streams of one request shape (a fixed prompt, greedy, `ignore_eos`, `max_tokens` M), each
stream sending its next request when the last one ends, and the engine's decode-only steps
that decoded exactly N requests timed by its step lines (vLLM's
enable_logging_iteration_details, which lengthwise logs too).

Every system gets the same work in every batch, so a difference here is the engine's
process (its settings, what runs beside it: the daemon's predictor, its decisions), not the
schedule. It is the control for a sweep's pairs flagged for engine speed, where the batches
differ. With more streams than --max-num-seqs a queue forms: lengthwise's, or vLLM's engine's.

    python -m bench.closedloop --systems vllm,lengthwise:ssjf --streams 4 --seconds 30 \\
        --rounds 2 --out out/bench/closedloop

prints, per system and round, the steps timed, their mean, median and 90th percentile, the
requests done, and the mean against the first system's in the same round.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import httpx
import numpy as np

from bench import enginespeed
from bench.servers import Server, Settings, System, parse_system

PROMPT = "the quick brown fox jumps over the lazy dog " * 12
WARM_S = 5.0


async def _stream(client: httpx.AsyncClient, model: str, index: int, max_tokens: int,
                  until: float) -> int:
    done = 0
    while time.monotonic() < until:
        response = await client.post("/v1/chat/completions", json={
            "model": model, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0,
            # a prefix of its own: no request finds another's prompt in the prefix cache
            "messages": [{"role": "user", "content": f"{index} {done} {PROMPT}"}]})
        response.raise_for_status()
        done += 1
    return done


async def closed_loop(base_url: str, model: str, streams: int, seconds: float,
                      max_tokens: int) -> int:
    """Requests done by `streams` closed-loop streams over `seconds`."""
    until = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        done = await asyncio.gather(*(_stream(client, model, k, max_tokens, until)
                                      for k in range(streams)))
    return sum(done)


def measure(system: System, settings: Settings, args: argparse.Namespace, round_: int
            ) -> tuple[list[float], int]:
    """(seconds of the decode-only steps at the full batch, min(--streams, --max-num-seqs),
    requests done) of one start of `system`."""
    server = Server(system, settings, args.out, log_suffix=f"-{round_}")
    try:
        server.wait_ready()
        model = settings.model.name
        asyncio.run(closed_loop(server.base_url, model, args.streams, WARM_S, args.max_tokens))
        logged = server.log_path.stat().st_size
        done = asyncio.run(closed_loop(server.base_url, model, args.streams, args.seconds,
                                       args.max_tokens))
    finally:
        server.stop()
    with server.log_path.open("rb") as log:
        log.seek(logged)
        lines = log.read().decode(errors="replace").splitlines()
    return enginespeed.steps_at(lines, min(args.streams, args.max_num_seqs)), done


def row(system: str, round_: int, steps: list[float], done: int, base: float | None) -> str:
    """One table line; `base` is the first system's mean step in this round."""
    if not steps:
        return f"| {system} | {round_ + 1} | 0 | – | – | – | {done} | – |"
    ms = np.asarray(steps) * 1000
    mean = float(ms.mean())
    ratio = f"{mean / base:.2f}x" if base else "–"
    return (f"| {system} | {round_ + 1} | {len(ms)} | {mean:.2f} | {np.median(ms):.2f} | "
            f"{np.percentile(ms, 90):.2f} | {done} | {ratio} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.closedloop", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", default="vllm,lengthwise:ssjf",
                        help="comma list (as bench sweep's); the first is the reference")
    parser.add_argument("--model", type=Path, default=Path("models/tiny-llama"))
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--streams", type=int, default=4,
                        help="closed-loop streams; steps are timed at min(streams, "
                             "max-num-seqs) requests")
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--seconds", type=float, default=30.0, help="per system and round")
    parser.add_argument("--rounds", type=int, default=2, help="systems alternate each round")
    parser.add_argument("--out", type=Path, required=True, help="folder for the servers' logs")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    settings = Settings(model=args.model.resolve(), max_num_seqs=args.max_num_seqs,
                        step_log=True)
    systems = [parse_system(spec) for spec in args.systems.split(",")]
    print(f"{args.streams} streams of {args.max_tokens} tokens, {args.seconds:g} s per system; "
          f"decode-only steps at batch {min(args.streams, args.max_num_seqs)} (ms)\n")
    print("| system | round | steps | mean | median | p90 | requests | mean vs first |")
    print("|---|---|---|---|---|---|---|---|")
    for round_ in range(args.rounds):
        order = systems if round_ % 2 == 0 else systems[::-1]
        measured = {system.spec: measure(system, settings, args, round_) for system in order}
        first = measured[systems[0].spec][0]
        base = float(np.mean(first)) * 1000 if first else None
        for system in systems:
            print(row(system.spec, round_, *measured[system.spec], base), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
