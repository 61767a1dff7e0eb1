"""`python -m bench.pooled`: one system's pairs against the baseline pooled over several
sweeps (synthetic sweep.json files): repetitions renumbered apart, another name taken
with OUT@SYSTEM, pairs worse counted, flagged pairs left out on request."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from bench.enginespeed import Bin, DecodeSpeed
from bench.metrics import RequestResult, summarize
from bench.pooled import main, pooled_runs, sizes_table, table
from bench.sweep import SweepResults
from bench.sweepstats import SweepRun
from bench.workload import WorkloadSpec


def _run(system: str, repeat: int, jct: float, step: float = 0.01,
         attainment: float | None = None) -> SweepRun:
    reqs = [RequestResult(index=i, arrival_s=float(i), prompt_tokens=5, output_tokens=10,
                          ok=True, ttft_s=jct / 4, jct_s=jct) for i in range(4)]
    speed = DecodeSpeed(step_s=step, batch=4.0, gaps=400, bins=[Bin(4, step, 400)])
    return SweepRun(system=system, load=1.0, rate=2.0, repeat=repeat, position=0,
                    summary=summarize(reqs), p99_tpot=None, attainment=attainment, refused=0.0,
                    engine_preemptions=0.0, policy_preemptions=0.0, speed=speed, wall_s=1.0)


def _sweep(folder: Path, systems: list[str], runs: list[SweepRun], repeats: int) -> str:
    folder.mkdir()
    results = SweepResults(
        model="tiny", systems=systems, loads=[1.0], repeats=repeats, capacity_rps=2.0,
        capacity_how="given", workload=WorkloadSpec(num=4), sample="held-out",
        slo_ttft=None, slo_tpot=None, slo=None, max_num_seqs=4, kv_blocks=0,
        max_running="auto", runs=runs)
    (folder / "sweep.json").write_bytes(msgspec.json.encode(results))
    return str(folder)


def test_pairs_of_several_sweeps_pool_apart(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    one = _sweep(tmp_path / "one", ["vllm", "lw"], [
        _run("vllm", 0, 2.0), _run("lw", 0, 1.0), _run("vllm", 1, 2.0), _run("lw", 1, 3.0),
        _run("vllm", 2, 2.0), _run("lw", 2, 2.0, step=0.0105)], 3)
    # the same code under another name; its engine stepped 1.2x vLLM's (flagged)
    two = _sweep(tmp_path / "two", ["vllm", "lw+k=v", "lw"], [
        _run("vllm", 0, 2.0), _run("lw+k=v", 0, 2.0, step=0.012), _run("lw", 0, 9.0)], 1)
    runs = pooled_runs([(Path(one), "lw"), (Path(two), "lw+k=v")], "vllm", "lw")
    assert sorted((r.system, r.repeat) for r in runs) == (
        [("lw", k) for k in range(4)] + [("vllm", k) for k in range(4)])
    # mean JCT 0.5x, 1.5x, 1.0x and (flagged) 1.0x: geometric mean 0.93x, worse in one pair
    assert "| 1x | 4 (1) | " in table(runs, "vllm")
    assert "| 0.93x (0.50-1.50; 1) |" in table(runs, "vllm")
    assert "| 1x | 3 (0) | " in table(runs, "vllm", unflagged=True)
    assert "| 0.91x (0.50-1.50; 1) |" in table(runs, "vllm", unflagged=True)

    # every latency 0.93x (the requests' TTFT scale with their JCT), no attainment measured
    assert table(runs, "vllm").rstrip().endswith("| – | 1.06x | yes |")  # engine step 1.06x

    # the plain means: JCT 1, 3, 2, 2 s against 2 s each (TTFT a quarter): equal, where the
    # geometric mean of the ratios says 0.93x; no objectives, no loop watch counted
    assert sizes_table(runs, "vllm").splitlines()[2] == (
        "| 1x | 4 | 500 / 500 | 500 / 500 | 166.67 / 166.67 | 2.00 / 2.00 | 2.00 / 2.00 | – "
        "| – |")
    with_stalls = [msgspec.structs.replace(run, waits={"lag:1.0": 98.0, "lag:+Inf": 100.0})
                   if run.system == "lw" else run for run in runs]
    assert sizes_table(with_stalls, "vllm").rstrip().endswith("| – | 8 in 4 runs |")

    main(["--system", "lw", one, f"{two}@lw+k=v"])
    out = capsys.readouterr().out
    assert "lw against vllm, 4 pairs from 2 sweeps" in out
    assert "| lw | 0.8-1.2x | mean_jct | 4 | 0.93x |" in out  # and at equal engine speed
    with pytest.raises(SystemExit, match="not 'lw\\+x'"):
        main(["--system", "lw+x", one])


def test_the_verdict_names_each_figure_past_its_limit() -> None:
    """Means at most 1.0x, tails at most 1.05x, attainment at least the baseline's."""
    runs = [_run("vllm", 0, 2.0, attainment=1.0), _run("lw", 0, 2.08, attainment=0.99),
            _run("vllm", 1, 2.0, attainment=0.9), _run("lw", 1, 2.0, attainment=0.9)]
    row = table(runs, "vllm", objectives_sent=True).splitlines()[-1]
    # every latency 1.02x (geometric mean of 1.04 and 1.0): past 1.0x, not past 1.05x
    assert row.endswith("| no: mean TTFT 1.02x, mean TPOT 1.02x, mean JCT 1.02x, "
                        "attainment 0.99x |"), row
    assert "| 0.99x (0.99-1.00; 1) |" in row  # attainment lower in one pair
    # best effort (the objectives only judged, not sent): attainment is not part of it
    assert table(runs, "vllm").splitlines()[-1].endswith("mean JCT 1.02x |")
