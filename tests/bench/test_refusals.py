"""bench.refusals: each refusal judged by the baseline's outcome for the same request of
the same draw, split by the overshoot the core's trace gave it, the late jobs and the inflow
the overload gate read."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from bench import refusals
from bench.metrics import RequestResult, summarize
from bench.sweep import RunFile, SweepResults, run_file
from bench.sweepstats import SweepRun
from bench.workload import WorkloadSpec

SYSTEM = "lengthwise:ssjf"


def _request(index: int, ttft: float | None) -> RequestResult:
    if ttft is None:  # refused
        return RequestResult(index=index, arrival_s=float(index), prompt_tokens=5,
                             output_tokens=0, ok=False, error="Too Many Requests")
    return RequestResult(index=index, arrival_s=float(index), prompt_tokens=5,
                         output_tokens=11, ok=True, ttft_s=ttft, jct_s=ttft + 0.1)


def _write(out: Path, label: str, system: str, load: float,
           ttfts: list[float | None]) -> None:
    reqs = [_request(i, ttft) for i, ttft in enumerate(ttfts)]
    run = SweepRun(system=system, load=load, rate=load, repeat=0, position=0,
                   summary=summarize(reqs), p99_tpot=None, attainment=None, refused=0,
                   engine_preemptions=0, policy_preemptions=0, speed=None, wall_s=1.0)
    path = run_file(out, label, load, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.encode(RunFile(run=run, requests=reqs)))


def test_refusals_judged_by_the_baseline_and_split_by_overshoot(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """At 1x lengthwise refused requests 1 and 2, which vLLM's server served in 0.5 s
    (wrong) and 3 s (right); at 2x request 0, which vLLM served late (right). The trace's
    refusals, in order, were 1.2x, 3.0x and 1.6x over the objective (1 s), with 1, 4 and 0
    late jobs counted by the overload gate, an inflow of 1.0, 1.3 and 1.6 read, and margins
    of 9.9, 1.2 and 0.8."""
    results = SweepResults(
        model="tiny", systems=["vllm", SYSTEM], loads=[1.0, 2.0], repeats=1,
        capacity_rps=1.0, capacity_how="given", workload=WorkloadSpec(num=3),
        sample="held-out", slo_ttft=1.0, slo_tpot=None, slo=None, max_num_seqs=4,
        kv_blocks=0, max_running="auto")
    (tmp_path / "sweep.json").write_bytes(msgspec.json.encode(results))
    _write(tmp_path, "vllm", "vllm", 1.0, [0.2, 0.5, 3.0])
    _write(tmp_path, "lengthwise-ssjf", SYSTEM, 1.0, [0.2, None, None])
    _write(tmp_path, "vllm", "vllm", 2.0, [2.0, 0.5, 0.5])
    _write(tmp_path, "lengthwise-ssjf", SYSTEM, 2.0, [None, 0.5, 0.5])
    trace = [{"ev": "admit", "t": 0.0, "id": "x"}] + [
        {"ev": "refuse", "t": float(k), "id": f"r{k}", "probe": True, "overshoot": over,
         "late": late, "inflow": inflow, "margin": margin}
        for k, (over, late, inflow, margin) in enumerate(
            ((1.2, 1, 1.0, 9.9), (3.0, 4, 1.3, 1.2), (1.6, 0, 1.6, 0.8)))]
    (tmp_path / "lengthwise-ssjf.trace.jsonl").write_text(
        "\n".join(json.dumps(line) for line in trace))
    tallies = refusals.tally(tmp_path)
    one, two = tallies[1.0, SYSTEM], tallies[2.0, SYSTEM]
    assert (one.refused, one.wrong, two.refused, two.wrong) == (2, 1, 1, 0)
    assert one.bands == [[0, 0], [1, 1], [0, 0], [0, 0], [1, 0]]  # 1.1-1.25x: the wrong one
    assert two.bands[3] == [1, 0] and not one.unmatched
    assert one.near == [[0, 0], [1, 1], [0, 0], [0, 0]]  # the near miss, with 1 late job
    assert two.near == [[0, 0]] * 4  # 1.6x: not a near miss
    assert one.inflow == [[1, 1], [0, 0], [1, 0], [0, 0]]  # the wrong one at inflow 1.0
    assert two.inflow == [[0, 0], [0, 0], [0, 0], [1, 0]]
    assert one.margin == [[0, 0], [1, 0], [0, 0], [0, 0], [1, 1]]  # the wrong one at 9.9
    assert two.margin == [[1, 0], [0, 0], [0, 0], [0, 0], [0, 0]]
    assert refusals.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| 1x | lengthwise:ssjf | 2 | 1 | 50 % | – | 1 / 1 | – | – | 0 / 1 |" in out
    assert "| 1x | lengthwise:ssjf | – | 1 / 1 | – | – |" in out  # by late jobs
    assert "| 1x | lengthwise:ssjf | 1 / 1 | – | 0 / 1 | – |" in out  # by inflow
    assert "| 1x | lengthwise:ssjf | – | 0 / 1 | – | – | 1 / 1 |" in out  # by margin
    # a trace that does not match the refusals (one line short): counted, not split
    (tmp_path / "lengthwise-ssjf.trace.jsonl").write_text(
        "\n".join(json.dumps(line) for line in trace[:-1]))
    assert refusals.tally(tmp_path)[1.0, SYSTEM].unmatched == 2
