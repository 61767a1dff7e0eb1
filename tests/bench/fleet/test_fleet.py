"""`lengthwise bench fleet`: capacity, steady throughput, and the sizes x placements table."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
import pytest

from bench.cli import main
from bench.fleet.cli import mean_rate
from bench.fleet.report import FleetResults, saturation_size, vs_linear
from bench.fleet.run import capacity_rps, steady_throughput, window_arrival_rps
from bench.metrics import RequestResult
from bench.sim import SimOptions
from bench.sim.overrides import build_config, build_sim
from bench.workload import Message, Request, at_rate
from daemon.executors.settings import SimConfig
from tests.bench.records import long_and_short

# Every step costs 10 ms whatever the batch: a 10-token job alone takes 0.1 s.
_FLAT = ["sim.prefill_base_s=0.0", "sim.prefill_per_token_s=0.0", "sim.decode_base_s=0.01",
         "sim.decode_per_seq_s=0.0", "sim.decode_per_context_token_s=0.0"]


def test_capacity_is_the_backlogged_service_rate() -> None:
    config = build_config(overrides=["scheduler.policy=ssjf", "scheduler.max_running=2"])
    flat = build_sim(SimConfig(), _FLAT)
    reqs = [Request(i, 5.0 * i, [Message("user", "x")], 8, 50) for i in range(40)]
    # 2 slots, 50 steps of 10 ms per job, and a freed slot joins the batch a step later:
    # 2 / 0.51 s per executor, twice that on two; the arrival times are ignored.
    one = 2 / 0.51
    assert capacity_rps(reqs, SimOptions(config=config, sim=flat)) == pytest.approx(one, rel=0.03)
    assert capacity_rps(reqs, SimOptions(config=config, sim=flat, executors=2)) == pytest.approx(
        2 * one, rel=0.06)


def test_steady_throughput_leaves_out_fill_and_drain() -> None:
    # One request per second for 100 s, each done 3 s after it arrives, 7 tokens each.
    results = [RequestResult(index=i, arrival_s=float(i), prompt_tokens=1, output_tokens=7,
                             ok=True, ttft_s=1.0, jct_s=3.0) for i in range(101)]
    rps, tps = steady_throughput(results)
    assert rps == pytest.approx(1.0, rel=0.02) and tps == pytest.approx(7.0, rel=0.02)
    # The arrivals in the same window (25 s to 100 s): 76 over 75 s.
    assert window_arrival_rps([r.arrival_s for r in results]) == pytest.approx(76 / 75)


def test_fleet_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = long_and_short(tmp_path, 80, every=6, long=120, short=15)
    out = tmp_path / "fleet"
    argv = ["fleet", "--sizes", "1,2", "--num", "40", "--calibrate-num", "30",
            "--arrivals", "poisson", "--lengths", f"records:{records}", "--predictor",
            "oracle", "--workers", "1", "--out", str(out),
            "--profile", str(Path("bench/profiles/tiny-llama-cpu.json")), "--max-running", "2"]
    assert main(argv) == 0
    printed = capsys.readouterr()
    assert "per executor is load 0.9" in printed.err
    assert "| 2 | central:least_queue |" in printed.out and "| 2 | router:predicted |" in (
        printed.out)
    res = msgspec.json.decode((out / "fleet.json").read_bytes(), type=FleetResults)
    assert len(res.points) == 2 * 2 * 3 and res.policy == "ssjf"
    for p in res.points:
        assert p.summary.n_completed == 40 and p.summary.n_failed == 0
        assert p.offered_rps == pytest.approx(p.executors * res.per_executor_rps)
        assert p.rounds > 0 and p.dispatcher_busy > 0 and p.wall_s > 0
    assert res.per_executor_rps == pytest.approx(0.9 * res.capacity_rps)
    lin = vs_linear(res.points)
    assert lin[(1, "central:predicted")] == 1.0 and 0.5 < lin[(2, "central:predicted")] < 2
    assert saturation_size(res.points, "central:predicted")[0] > 0
    assert (out / "fleet.png").stat().st_size > 0 and (out / "fleet.md").exists()


def test_fleet_refuses_a_bad_placement(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet", "--placements", "random"]) == 2
    assert "scheduler.placement" in capsys.readouterr().err


def test_per_executor_serves_k_requests_per_executor_at_the_scaled_rate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = long_and_short(tmp_path, 80, every=6, long=120, short=15)
    out = tmp_path / "fleet"
    argv = ["fleet", "--sizes", "1,3", "--per-executor", "12", "--calibrate-num", "20",
            "--arrivals", "poisson", "--lengths", f"records:{records}", "--predictor",
            "oracle", "--workers", "1", "--out", str(out), "--bindings", "central",
            "--placements", "predicted,least_queue",
            "--profile", str(Path("bench/profiles/tiny-llama-cpu.json")), "--max-running", "2"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "12 requests per executor" in printed and "| vs arrivals |" in printed
    res = msgspec.json.decode((out / "fleet.json").read_bytes(), type=FleetResults)
    assert res.per_executor == 12 and res.num == 36 and len(res.points) == 2 * 2
    for p in res.points:  # the first N x K requests, every one served
        assert p.summary.n_completed == 12 * p.executors and p.summary.n_failed == 0
        assert p.offered_rps == pytest.approx(p.executors * res.per_executor_rps)
        assert 0 < p.window_arrival_rps < math.inf
    assert main([*argv[:3], "--per-executor", "1", *argv[5:]]) == 2


def test_a_head_of_the_window_is_rescaled_to_its_own_mean_rate() -> None:
    reqs = [Request(i, t, [], 8, 50) for i, t in enumerate([0.0, 1.0, 5.0, 6.0, 30.0])]
    head = reqs[:4]  # 3 gaps over 6 s: 0.5 req/s, where the whole window has 4 / 30 s
    assert mean_rate(head) == pytest.approx(0.5) and mean_rate(reqs) == pytest.approx(4 / 30)
    scaled = at_rate(head, mean_rate(head), 6.0)
    assert mean_rate(scaled) == pytest.approx(6.0) and scaled[0].arrival_s == 0.0
    assert mean_rate(reqs[:1]) == 1.0
