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


def test_validate_replays_the_runs_workload(tmp_path: Path) -> None:
    """bench.validate rebuilds each run's workload from the results file: fed the simulator's
    own results as the "real" run, it must find zero error, and it draws the CDF plot."""
    import msgspec

    from bench import validate
    from bench.compare import CompareResults, RunRecord
    from bench.costfile import Profile
    from bench.metrics import summarize
    from daemon.config import SimConfig

    records = tmp_path / "r.jsonl"
    records.write_text("\n".join(f'{{"prompt": "p{i}", "output_tokens": {5 + 7 * i}}}'
                                 for i in range(30)))
    spec = WorkloadSpec(lengths=f"records:{records}", rate=40.0, num=30, seed=3)
    runs = []
    for policy in ("fcfs", "oracle-sjf"):
        reqs = build(spec)
        how = "none" if policy == "fcfs" else "oracle"
        results = simulate(reqs, predictions(reqs, how, 3),
                           SimOptions(policy=policy, max_running=2))
        runs.append(RunRecord(system=f"lengthwise:{policy}", rate=40.0,
                              summary=summarize(results), requests=results, wall_s=1.0))
    compare = CompareResults(model="m", max_num_seqs=2, workload=spec, natural=False,
                             startup_s={}, runs=runs)
    path = tmp_path / "results.json"
    path.write_bytes(msgspec.json.encode(compare))
    profile = tmp_path / "p.json"
    profile.write_bytes(msgspec.json.encode(Profile(name="p", source="test", max_num_seqs=2,
                                                    sim=SimConfig())))
    plot = tmp_path / "v.png"
    assert validate.main(["--results", str(path), "--profile", str(profile),
                          "--plot", str(plot)]) == 0
    rows = validate.validate(compare, msgspec.json.decode(profile.read_bytes(), type=Profile),
                             "none")
    assert [r.system for r in rows] == ["lengthwise:fcfs", "lengthwise:oracle-sjf"]
    assert all(r.mean_error == pytest.approx(0.0) and r.p99_error == pytest.approx(0.0)
               for r in rows)
    assert plot.stat().st_size > 0
