"""`python -m bench.late`: the first tokens past the objective, counted and sized per load
from a sweep's run files (a synthetic sweep), refusals beside them."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from bench.late import main
from bench.metrics import RequestResult, summarize
from bench.sweep import RunFile, SweepResults
from bench.sweepstats import SweepRun
from bench.workload import WorkloadSpec


def _requests(ttfts: list[float | None]) -> list[RequestResult]:
    """None: refused."""
    return [RequestResult(index=i, arrival_s=float(i), prompt_tokens=5,
                          output_tokens=0 if t is None else 10, ok=t is not None, ttft_s=t,
                          jct_s=None if t is None else t + 1.0,
                          error="Too Many Requests" if t is None else "")
            for i, t in enumerate(ttfts)]


def _sweep(out: Path, runs: dict[tuple[str, int], list[float | None]],
           slo_ttft: float | None = 1.0) -> None:
    (out / "runs").mkdir(parents=True)
    records = []
    for (system, repeat), ttfts in runs.items():
        requests = _requests(ttfts)
        run = SweepRun(system=system, load=0.8, rate=2.0, repeat=repeat, position=0,
                       summary=summarize(requests), p99_tpot=None, attainment=None,
                       refused=0.0, engine_preemptions=0.0, policy_preemptions=0.0,
                       speed=None, wall_s=1.0)
        label = system.replace(":", "-")
        (out / "runs" / f"{label}-x0.8-{repeat}.json").write_bytes(
            msgspec.json.encode(RunFile(run=run, requests=requests)))
        records.append(run)
    results = SweepResults(
        model="tiny", systems=["vllm", "lengthwise:ssjf"], loads=[0.8], repeats=2,
        capacity_rps=2.0, capacity_how="given", workload=WorkloadSpec(num=4),
        sample="held-out", slo_ttft=slo_ttft, slo_tpot=None, slo=None, max_num_seqs=4,
        kv_blocks=0, max_running="auto", runs=records)
    (out / "sweep.json").write_bytes(msgspec.json.encode(results))


def test_late_first_tokens_are_counted_and_sized_per_load(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _sweep(tmp_path / "a", {("vllm", 0): [0.1, 1.2, 1.4, 0.5],
                            ("lengthwise:ssjf", 0): [0.1, 0.2, 2.0, None],
                            ("vllm", 1): [0.1, 1.0, 0.3, 0.2],  # 1.0 s is on time
                            ("lengthwise:ssjf", 1): [0.1, 0.9, 0.3, 0.2],
                            ("lengthwise:ssjf", 2): [5.0, 5.0, 5.0, 5.0]})  # no pair
    main(["--system", "lengthwise:ssjf", str(tmp_path / "a")])
    rows = capsys.readouterr().out.splitlines()
    assert rows[2] == "| 0.8x | 2 | 1: 2000 / 2000 / 2000 | 2: 1300 / 1380 / 1400 | 1 / 0 |"


def test_a_sweep_without_an_objective_is_refused(tmp_path: Path) -> None:
    _sweep(tmp_path / "b", {("vllm", 0): [0.1], ("lengthwise:ssjf", 0): [0.1]},
           slo_ttft=None)
    with pytest.raises(SystemExit, match="without --slo-ttft"):
        main(["--system", "lengthwise:ssjf", str(tmp_path / "b")])
