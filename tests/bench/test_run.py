"""`bench run` and `bench compare` end to end on the simulated engine (what is under test is
the harness; vLLM's bench client drives the real daemon in tests/integration/test_clients.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.cli import main
from tests.support import TINY, DaemonProcess, config_text, free_port


def _records(tmp_path: Path, n: int = 12) -> Path:
    path = tmp_path / "records.jsonl"
    path.write_text("\n".join(f'{{"prompt": "tell me about item {i}", "output_tokens": '
                              f'{8 + 3 * i}}}' for i in range(n)))
    return path


def _daemon(tmp_path: Path, kind: str) -> DaemonProcess:
    config = tmp_path / "lengthwise.toml"
    config.write_text(config_text(TINY, free_port(), engine_kind=kind))
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    try:
        daemon.wait_ready()
    except Exception:
        daemon.stop()
        raise
    return daemon


@pytest.fixture(scope="module")
def sim_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """One daemon on the simulated engine for the module's clients (each test counts the
    jobs it finished)."""
    daemon = _daemon(tmp_path_factory.mktemp("sim-daemon"), "sim")
    yield daemon
    assert daemon.stop() == 0, daemon.log()


def _bench(daemon: DaemonProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str],
           *extra: str) -> dict[str, float]:
    capsys.readouterr()
    code = main(["run", "--target", daemon.base_url, "--num", "12", "--rate", "20",
                 "--lengths", f"records:{_records(tmp_path)}", "--seed", "1", "--json",
                 "--requests-out", str(tmp_path / "requests.jsonl"), *extra])
    assert code == 0
    return dict(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))


def test_bench_run_against_sim_daemon(sim_daemon: DaemonProcess, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    finished = sim_daemon.metric("lengthwise_jobs_finished_total")
    out = _bench(sim_daemon, tmp_path, capsys, "--slo-ttft", "1e-9")
    assert out["n_completed"] == 12 and out["n_failed"] == 0
    assert 0 < out["mean_ttft"] <= out["mean_jct"] <= out["p99_jct"]
    assert out["goodput_rps"] == 0.0  # nothing meets a 1 ns TTFT
    # Output lengths were forced: the server produced exactly the requested tokens.
    sent = sum(8 + 3 * i for i in range(12))
    got = [json.loads(line)["output_tokens"]
           for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert sum(got) == sent
    assert sim_daemon.metric("lengthwise_jobs_finished_total") == finished + 12


def test_bench_compare_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`bench compare` starts the system, drives it (bench run's driver, as against the sim
    daemon above), stops it, and writes the run, its aggregate, the table and the plots, with
    who used the CPU during the run. On the simulated engine: the harness is under test here
    (bench.servers starts vLLM's server on the real engine in
    tests/integration/test_differential.py, `bench sweep` the daemon in the benchmarks);
    the real engine's start cost this test ~20 s. (Repetitions' order and their medians with
    min-max: tests/bench/test_compare.py.)"""
    import msgspec

    from bench.compare import CompareResults

    out = tmp_path / "cmp"
    code = main(["compare", "--engine-kind", "sim", "--model", str(TINY),
                 "--systems", "lengthwise:fcfs",
                 "--rates", "20", "--num", "6", "--repeats", "1", "--lengths",
                 f"records:{_records(tmp_path, 6)}", "--out", str(out)])
    assert code == 0
    results = msgspec.json.decode((out / "results.json").read_bytes(), type=CompareResults)
    assert [(r.system, r.rate, r.repeat) for r in results.runs] == [
        ("lengthwise:fcfs", 20.0, 0)]
    for run in results.runs:
        assert run.summary.n_completed == 6 and run.summary.n_failed == 0
        assert run.summary.throughput_tps > 0
        assert run.cpu is not None and run.cpu.server_cores > 0
        # the clock learned over the run, and at its end (bench/learned.py)
        assert Path(run.learned_profile).is_file()
        assert Path(run.learned_profile.removesuffix(".json") + "-end.json").is_file()
    assert len(results.startup_s["lengthwise:fcfs"]) == 1
    assert all(s > 0 for s in results.startup_s["lengthwise:fcfs"])
    assert [(a.rate, a.repeats) for a in results.aggregates] == [(20.0, 1)]
    for agg in results.aggregates:
        jct = agg.spread["mean_jct"]
        assert jct.min <= agg.summary.mean_jct == jct.median <= jct.max
    table = (out / "results.md").read_text()
    main_table = table.split("\n\n")[0]  # then the ratios to vLLM's (none here: "–")
    assert main_table.count("| lengthwise:fcfs |") == 1 and "–" in table
    assert {p.name for p in out.glob("*.png")} >= {"jct_vs_rate.png", "throughput_vs_rate.png"}


def test_vllm_client_burstiness_is_the_gamma_shape() -> None:
    from bench.vllm_client import burstiness

    assert burstiness(1.0) == 1.0 and burstiness(2.0) == 0.25  # shape = 1 / CV^2
