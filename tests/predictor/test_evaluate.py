"""The eval report, through `predictor eval` on a trained proxy."""

from __future__ import annotations

import json

from predictor.cli import main


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
