"""`lengthwise sim`: the real core on SimExecutors in virtual time."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from bench.sim import SimOptions, main, predictions, simulate
from bench.workload import WorkloadSpec, build

AZURE = Path("/work/shared/data/azure_llm_2023_conv.csv")


def test_ten_minute_trace_on_eight_executors_takes_seconds() -> None:
    spec = WorkloadSpec(arrivals=f"trace:{AZURE}", lengths=f"trace:{AZURE}", rate=2.0,
                        num=1201, cap=32, max_input=512)
    requests = build(spec)
    assert requests[-1].arrival_s == pytest.approx(600.0)
    started = time.perf_counter()
    results = simulate(requests, predictions(requests, "oracle", 0),
                       SimOptions(policy="ssjf", executors=8))
    wall = time.perf_counter() - started
    assert all(r.ok for r in results)
    assert max(r.finish_s for r in results) > 600.0  # virtual seconds served ...
    assert wall < 30.0  # ... without sleeping through them (usually ~2 s)
    assert sum(r.output_tokens for r in results) == sum(r.output_tokens for r in requests)


def test_oracle_sjf_beats_fcfs_on_mean_under_load() -> None:
    from bench.workload import Message, Request

    # Three long jobs, then many short ones, on one 1-slot executor: SJF lets shorts pass.
    reqs = [Request(i, 0.001 * i, [Message("user", "x")], 20, 400 if i < 3 else 10)
            for i in range(30)]
    opts = {"executors": 1, "max_running": 1}
    fcfs = simulate(reqs, [None] * 30, SimOptions(policy="fcfs", **opts))
    sjf = simulate(reqs, predictions(reqs, "oracle", 0), SimOptions(policy="oracle-sjf", **opts))
    mean = lambda rs: sum(r.jct_s for r in rs) / len(rs)
    assert mean(sjf) < 0.5 * mean(fcfs)


def test_cli_prints_the_bench_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = tmp_path / "r.jsonl"
    records.write_text("\n".join(f'{{"prompt": "p{i}", "output_tokens": {5 + i}}}'
                                 for i in range(20)))
    assert main(["--policy", "ssjf", "--predictor", "noisy-oracle:0.3", "--num", "20",
                 "--rate", "50", "--lengths", f"records:{records}", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_completed"] == 20 and out["p99_jct"] >= out["p50_jct"] > 0
