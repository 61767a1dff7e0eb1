"""`lengthwise sim`: the real core on SimExecutors in virtual time."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from bench.sim import SimOptions, main, predictions, simulate
from bench.sim.overrides import build_config
from bench.sim.predictions import Estimate
from bench.workload import Message, Request, WorkloadSpec, build
from tests.support import AZURE_CONV as AZURE
from tests.support import SECONDS_AGING


def _opts(policy: str, **kw: object) -> SimOptions:
    max_running = kw.pop("max_running", 4)
    aging = SECONDS_AGING if kw.pop("seconds_aging", False) else []
    config = build_config(overrides=[f"scheduler.policy={policy}",
                                     f"scheduler.max_running={max_running}", *aging])
    return SimOptions(config=config, **kw)  # type: ignore[arg-type]


def _records(tmp_path: Path, n: int = 20, step: int = 1) -> Path:
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(f'{{"prompt": "p{i}", "output_tokens": {5 + step * i}}}'
                              for i in range(n)))
    return path


def test_ten_minute_trace_on_eight_executors_takes_seconds() -> None:
    spec = WorkloadSpec(arrivals=f"trace:{AZURE}", lengths=f"trace:{AZURE}", rate=2.0,
                        num=1201, cap=32, max_input=512)
    requests = build(spec)
    assert requests[-1].arrival_s == pytest.approx(600.0)
    started = time.perf_counter()
    run = simulate(requests, predictions(requests, "oracle", 0), _opts("ssjf", executors=8))
    wall = time.perf_counter() - started
    assert all(r.ok for r in run.results)
    assert max(r.finish_s for r in run.results) > 600.0  # virtual seconds served ...
    assert wall < 30.0  # ... without sleeping through them (usually ~2 s)
    assert sum(r.output_tokens for r in run.results) == sum(r.output_tokens for r in requests)


def _long_then_short(n: int = 30) -> list[Request]:
    # Three long jobs, then many short ones: SJF lets the shorts pass.
    return [Request(i, 0.001 * i, [Message("user", "x")], 20, 400 if i < 3 else 10)
            for i in range(n)]


def test_oracle_sjf_beats_fcfs_on_mean_under_load() -> None:
    reqs = _long_then_short()
    fcfs = simulate(reqs, predictions(reqs, "none", 0), _opts("fcfs", max_running=1)).results
    sjf = simulate(reqs, predictions(reqs, "oracle", 0),
                   _opts("oracle-sjf", max_running=1, seconds_aging=True)).results
    mean = lambda rs: sum(r.jct_s for r in rs) / len(rs)
    assert mean(sjf) < 0.5 * mean(fcfs)


def test_aging_override_changes_the_schedule() -> None:
    """--set scheduler.aging.promote_after_s reaches the core: with a tiny threshold the
    long jobs are promoted before the shorts, as in FCFS."""
    reqs = _long_then_short()
    preds = predictions(reqs, "oracle", 0)
    opts = lambda *o: SimOptions(config=build_config(
        overrides=["scheduler.policy=ssjf", "scheduler.max_running=1", *o]))
    no_aging = simulate(reqs, preds, opts("scheduler.aging.enabled=false")).results
    aged = simulate(reqs, preds, opts("scheduler.aging.promote_after_s=0.001")).results
    assert no_aging[1].jct_s > aged[1].jct_s  # the second long job: last vs early


def test_noisy_iterative_repredicts_isrtf_jobs() -> None:
    reqs = [Request(i, 0.0, [Message("user", "x")], 20, 200) for i in range(6)]
    opts = _opts("isrtf", max_running=2, iterative="noisy:0.3")
    run = simulate(reqs, predictions(reqs, "noisy-oracle:0.3", 0), opts)
    assert all(r.ok for r in run.results) and run.repredictions > 0


def test_cli_prints_the_bench_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--policy", "ssjf", "--predictor", "noisy-oracle:tau=0.5", "--num", "20",
                 "--rate", "50", "--lengths", f"records:{_records(tmp_path)}", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_completed"] == 20 and out["p99_jct"] >= out["p50_jct"] > 0
    assert out["policy"] == "ssjf" and out["sample"] == "external"


def test_cli_refuses_a_bad_key_with_its_name(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--num", "5", "--lengths", f"records:{_records(tmp_path)}", "--predictor", "none"]
    assert main([*args, "--set", "policies.isrtf.margn=0.5"]) == 2
    assert "margn" in capsys.readouterr().err
    assert main([*args, "--set", "scheduler.aging.promote_after_s=soon"]) == 2
    assert "promote_after_s" in capsys.readouterr().err


def test_cli_overhead_times_decision_rounds(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from bench.sim.overhead import measure_overhead

    reqs = [Request(i, 0.0, [Message("user", "x")], 20, 30) for i in range(80)]
    row = measure_overhead(reqs, predictions(reqs, "oracle", 0), _opts("ssjf"), waiting=50)
    assert row.policy == "ssjf" and row.rounds > 0 and 0 < row.p50_us <= row.max_us


def test_validate_replays_the_runs_workload(tmp_path: Path) -> None:
    """bench.validate rebuilds each run's workload from the results file: fed the simulator's
    own results as the "real" run, it must find zero error, and it draws the CDF plot."""
    import msgspec

    from bench import validate
    from bench.compare import CompareResults, RunRecord
    from bench.costfile import Profile
    from bench.metrics import summarize
    from daemon.config import SimConfig

    spec = WorkloadSpec(lengths=f"records:{_records(tmp_path, 30, 7)}", rate=40.0, num=30,
                        seed=3)
    runs = []
    for policy in ("fcfs", "oracle-sjf"):
        reqs = build(spec)
        how = "none" if policy == "fcfs" else "oracle"
        outcome = simulate(reqs, predictions(reqs, how, 3), _opts(policy, max_running=2))
        results = outcome.results
        runs.append(RunRecord(system=f"lengthwise:{policy}", rate=40.0,
                              summary=summarize(results), requests=results, wall_s=1.0,
                              engine_preemptions=outcome.engine_preemptions))
    compare = CompareResults(model="m", max_num_seqs=2, workload=spec, natural=False,
                             startup_s={}, runs=runs, max_running="2")  # as simulated
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
               and r.sim_preemptions == r.real_preemptions for r in rows)
    assert plot.stat().st_size > 0
    # The same requests sent twice as fast: the rate doubles and the queue is longer.
    faster = validate.validate(compare, msgspec.json.decode(profile.read_bytes(), type=Profile),
                               "none", load=2.0)
    assert [r.rate for r in faster] == [80.0, 80.0]
    assert all(f.sim_mean_jct > r.sim_mean_jct for f, r in zip(faster, rows, strict=True))


def test_budgets_keep_the_truth_from_predicted_policies() -> None:
    """A too-long prediction with forced budgets (max_tokens = true length) would turn ssjf
    into oracle SJF through the core's budget cap; the simulator turns the cap off there
    (scheduler.trust_budget = false), and with natural stops the budget is the context room:
    either way ssjf sees only its (here useless, constant) prediction, i.e. runs as FCFS."""
    reqs = _long_then_short()
    flat = [Estimate(1000.0)] * len(reqs)  # longer than every true length
    mean = lambda rs: sum(r.jct_s for r in rs) / len(rs)
    one = {"max_running": 1, "seconds_aging": True}
    fcfs = mean(simulate(reqs, flat, _opts("fcfs", **one)).results)
    forced = mean(simulate(reqs, flat, _opts("ssjf", **one)).results)
    natural = mean(simulate(reqs, flat, _opts("ssjf", natural=True, **one)).results)
    oracle = mean(simulate(reqs, flat, _opts("oracle-sjf", **one)).results)
    assert oracle < 0.5 * fcfs  # what the leak would have handed ssjf
    assert forced == pytest.approx(fcfs)
    assert natural == pytest.approx(fcfs)


def test_objectives_are_admitted_as_the_daemon_does_and_replayed(tmp_path: Path) -> None:
    """With an objective on every request, the simulated core refuses what it cannot serve
    in time (a failed result, no tokens); a results file holding those refusals (null
    TTFT and JCT in its JSON) is read back by bench.validate, which replays them with the
    same objective and refuses about as many."""
    import msgspec

    from bench import validate
    from bench.compare import CompareResults, RunRecord
    from bench.costfile import Profile
    from bench.metrics import summarize
    from daemon.config import SimConfig
    from daemon.core.job import Slo

    spec = WorkloadSpec(lengths=f"records:{_records(tmp_path, 40, 7)}", rate=200.0, num=40,
                        seed=3)
    reqs = build(spec)
    slo = Slo(ttft_s=0.05, tpot_s=1.0)
    outcome = simulate(reqs, predictions(reqs, "oracle", 3),
                       _opts("oracle-sjf", max_running=2, slo=slo))
    refused = [r for r in outcome.results if r.error.startswith("refused")]
    served = [r for r in outcome.results if r.ok]
    assert refused and served and len(refused) + len(served) == len(reqs)
    assert all(r.output_tokens == 0 for r in refused)
    # Without objectives the same burst is served whole, late.
    plain = simulate(reqs, predictions(reqs, "oracle", 3), _opts("oracle-sjf", max_running=2))
    assert all(r.ok for r in plain.results)

    summary = summarize(outcome.results, slo.ttft_s, slo.tpot_s)
    compare = CompareResults(
        model="m", max_num_seqs=2, workload=spec, natural=False, startup_s={}, slo=slo,
        runs=[RunRecord(system="lengthwise:oracle-sjf", rate=200.0, summary=summary,
                        requests=outcome.results, wall_s=1.0)])
    path = tmp_path / "results.json"
    path.write_bytes(msgspec.json.encode(compare))
    assert b"null" in path.read_bytes()
    read = msgspec.json.decode(path.read_bytes(), type=CompareResults)
    profile = Profile(name="p", source="test", max_num_seqs=2, sim=SimConfig())
    (row,) = validate.validate(read, profile, "none")
    # The replay (its own profile, no predictor) learns its forecasts' errors on its own
    # clock, so it refuses about as many, not the same ones.
    assert row.refused is not None and row.refused[0] == len(refused)
    assert row.refused[1] == pytest.approx(len(refused), abs=len(refused) / 2)
    assert row.goodput is not None and row.goodput[0] == pytest.approx(summary.goodput_rps)
    assert row.goodput[1] > 0
    assert "refused: real | sim" in validate.table([row])
