"""Prediction quality metrics, latency figures, and the eval report (on a stub predictor, and
through `predictor eval` on a trained proxy)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from predictor.api import PredictInput, Predictor
from predictor.cli import main
from predictor.evaluate import (
    batch_ms,
    coverage,
    linear_fit,
    percentiles,
    quality,
    quintiles,
    report,
    single_request_ms,
    timed_ms,
)
from predictor.manifest import Manifest
from predictor.records import Message, Record


def test_quality_of_perfect_reversed_and_constant_predictions() -> None:
    true = np.asarray([10.0, 20.0, 40.0, 80.0, 160.0])
    bounds = quintiles(true)
    perfect = quality(true, true, bounds)
    assert perfect == {"n": 5, "mae": 0.0, "rmse": 0.0, "r2": 1.0, "acc5": 1.0,
                       "kendall_tau": pytest.approx(1.0)}
    assert quality(true[::-1], true, bounds)["kendall_tau"] == pytest.approx(-1.0)
    constant = quality(np.full(5, 50.0), true, bounds)
    assert constant["kendall_tau"] == 0.0 and constant["mae"] == pytest.approx(np.mean(
        np.abs(50.0 - true)))
    assert math.isnan(quality(true[:1], true[:1], bounds)["r2"])  # no variance to explain


def test_quintiles_linear_fit_and_coverage() -> None:
    assert quintiles(np.arange(101.0)) == [20.0, 40.0, 60.0, 80.0]
    a, b = linear_fit(np.asarray([0.0, 1.0, 2.0]), np.asarray([1.0, 3.0, 5.0]))
    assert (a, b) == (pytest.approx(2.0), pytest.approx(1.0))
    assert coverage(np.asarray([5.0, 5.0]), np.asarray([4.0, 6.0])) == 0.5


def test_timing_helpers_warm_up_and_batch() -> None:
    calls: list[list[int]] = []
    assert len(timed_ms(lambda: calls.append([]), 3)) == 3 and len(calls) == 4
    calls.clear()
    assert len(single_request_ms(calls.append, [1, 2, 3], repeats=4)) == 4
    assert calls == [[1], [2], [3], [1], [1]]  # one request a call, cycling (warm-up first)
    calls.clear()
    assert batch_ms(calls.append, [1, 2], size=5, repeats=1) >= 0.0
    assert calls[0] == [1, 2, 1, 2, 1]
    assert all(math.isnan(v) for v in percentiles(np.zeros(0)).values())
    assert percentiles(np.asarray([1.0, 3.0]))["p50_ms"] == 2.0


class _Echo(Predictor):
    """Predicts twice the prompt's length in characters; learns nothing."""

    kind = "echo"
    path = Path("echo")
    chars_per_token = 4.0

    def predict(self, batch: list[PredictInput]) -> list[float]:
        return [2.0 * len(inp.messages[-1].content) for inp in batch]

    def eval_extra(self, records: list[Record]) -> dict[str, float]:
        return {"extra": float(len(records))}


def test_report_on_a_stub_predictor() -> None:
    records = [Record(id=f"c{i}#0", messages=[Message("user", "x" * (i + 1))], response="r",
                      output_tokens=2 * (i + 1)) for i in range(30)]
    records.append(Record(id="long#0", messages=[Message("user", "x" * 3000)], response="r",
                          output_tokens=6000))
    manifest = Manifest(kind="echo", quintiles=[5.0, 10.0, 20.0, 40.0], train_mean=20.0,
                        baseline_linear=[1.0, 0.0])
    result = report(_Echo(), manifest, records)
    assert result["kind"] == "echo" and result["mae"] == 0.0 and result["n"] == 31
    assert "coverage_p50" not in result  # no quantile outputs
    assert result["by_round"]["first"]["n"] == 31 and "later" not in result["by_round"]
    assert result["within_2048"]["n"] == 30 and result["within_2048"]["dropped"] == 1
    assert {"p50_ms", "p99_ms", "batch32_ms", "p50_ms_512tok"} <= set(result)
    assert set(result["baselines"]) == {"train_mean", "linear_prompt_length"}
    assert result["extra"] == 31.0


def test_eval_cli_prints_the_report(small_train, small_proxy, capsys) -> None:
    assert main(["eval", "--model", str(small_proxy), "--data", str(small_train), "--json",
                 "--limit", "80"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("n", "mae", "rmse", "r2", "acc5", "kendall_tau", "p50_ms", "p99_ms",
                "batch32_ms"):
        assert key in report
    assert set(report["baselines"]) == {"train_mean", "linear_prompt_length"}
    assert report["n"] == 80


def test_eval_reports_coverage_and_the_tail_cut(small_train, small_proxy, capsys) -> None:
    assert main(["eval", "--model", str(small_proxy), "--data", str(small_train), "--json",
                 "--limit", "120"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0.0 <= report["coverage_p50"] <= report["coverage_p90"] <= 1.0
    assert "coverage_p90" in report["by_round"]["first"]
    cut = report["within_2048"]
    assert cut["n"] + cut["dropped"] == 120 and cut["n"] > 0
