"""bench.forecasterrors: a forecast replayed with the services that came true names the
input that erred."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import forecasterrors


def _trace(t: float = 100.0) -> list[dict[str, object]]:
    """One running job "r" forecast to end in 1 s and one job "x" of 1 s ahead of "j", one
    slot: "j" is forecast to start in 2 s. "r" made its 100 predicted tokens at half the
    pace (2 s); "x" took its 1 s; "j" started 3 s after its admission, past its latest
    start (2.5 s)."""
    lane = {"name": "e0", "kv_blocks": 100, "block": 16, "slots": 1,
            "contexts": {"r": 10}, "ends": [[1.0, "r"]], "running": {"r": [10, 0, 100, 100.0]}}
    return [
        {"ev": "admit", "t": t, "id": "j", "arrival": t, "context": 10, "queue_s": 2.0,
         "memory_s": 0.0, "ahead": [["x", 10, 1.0]], "step_s": 0.0, "latest": t + 2.5,
         "refused": None, "lanes": [lane]},
        {"ev": "stop", "t": t + 2.0, "id": "r", "ended": True, "generated": 100,
         "predicted": 100, "launched": t - 1, "first": t - 1},
        {"ev": "launch", "t": t + 2.0, "id": "x", "lane": "e0", "waiting": 1, "running": 0},
        {"ev": "stop", "t": t + 3.0, "id": "x", "ended": True, "generated": 10,
         "predicted": 10, "launched": t + 2.0, "first": t + 2.01},
        {"ev": "launch", "t": t + 3.0, "id": "j", "lane": "e0", "waiting": 0, "running": 0}]


def test_the_running_jobs_pace_explains_a_late_start() -> None:
    trace = _trace()
    (sample,) = forecasterrors.samples(trace, forecasterrors.Outcomes(trace))
    assert sample.depth == 1
    assert sample.forecast == pytest.approx(2.0)
    assert sample.real == pytest.approx(3.0) and sample.deadline == pytest.approx(2.5)
    assert sample.running == pytest.approx(3.0)  # its real end explains it all ...
    assert sample.tokens == pytest.approx(2.0)  # ... not its token count ...
    assert sample.pace == pytest.approx(3.0)  # ... its pace
    assert sample.both == pytest.approx(3.0)
    table = forecasterrors.report([sample])
    assert "| 1 | 1 | 1.50 | 1.50 | 1.00 | 1.50 | 1.50 | 1.00 |" in table
    assert "| 1 | 0 | 0 | 1 | – |" in table  # a margin of 1 accepts it, late
    assert "| 1.4 | 1 | 1 | 0 | 100% |" in table  # 1.4 refuses it, rightly


def test_the_command_reads_a_sweeps_traces(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    lines = "\n".join(json.dumps(r) for r in _trace())
    (tmp_path / "lengthwise-ssjf.trace.jsonl").write_text(lines)
    (tmp_path / "lengthwise-ssjf-1.trace.jsonl").write_text(lines.replace('"j"', '"k"'))
    assert forecasterrors.main([str(tmp_path)]) == 0
    assert "2 queue forecasts of accepted requests in 2 traces" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--trace"):
        forecasterrors.main([str(tmp_path / "nothing")])
