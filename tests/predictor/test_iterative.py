"""Iterative predictor: window examples, trains on K-token windows, predicts remaining tokens,
per-window eval."""

from __future__ import annotations

import json

import numpy as np
import pytest

from predictor import PredictInput, load_predictor
from predictor.cli import main
from predictor.iterative import baseline_remaining, log_ratio, markdown, window_examples
from predictor.records import Message, Record, read_records
from tests.predictor.conftest import tokenizer_dir


def test_train_predict_and_eval(small_train, tmp_path, capsys) -> None:
    out = tmp_path / "it"
    assert main(["train", "--kind", "iterative", "--data", str(small_train), "--out", str(out),
                 "--epochs", "2", "--limit", "300", "--dev-limit", "50", "--max-windows", "6",
                 "--tokenizer", tokenizer_dir()]) == 0
    predictor = load_predictor(out)
    assert predictor.kind == "iterative"
    record = next(iter(read_records(small_train)))
    inp = PredictInput.from_record(record)
    total = predictor.predict([inp])[0]
    remaining = predictor.predict_remaining([(inp, ""), (inp, record.response[:300])])
    # one input alone or in a batch of two: the same answer up to float summation order
    assert remaining[0] == pytest.approx(total, rel=1e-4) and all(r >= 1.0 for r in remaining)
    capsys.readouterr()
    assert main(["eval", "--model", str(out), "--data", str(small_train), "--json",
                 "--limit", "40"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "0" in report["per_window"] and "1" in report["per_window"]
    assert {"mae", "r2", "acc5", "kendall_tau"} <= set(report["per_window"]["0"])


def test_windows_report_compares_with_first_prediction_minus_tokens(small_train, tmp_path,
                                                                    capsys) -> None:
    from predictor import default_predictor_path

    out = tmp_path / "it"
    assert main(["train", "--kind", "iterative", "--data", str(small_train), "--out", str(out),
                 "--epochs", "1", "--limit", "200", "--dev-limit", "20", "--max-windows", "3",
                 "--tokenizer", tokenizer_dir()]) == 0
    capsys.readouterr()
    assert main(["windows", "--model", str(out), "--data", str(small_train), "--json",
                 "--limit", "60", "--max-windows", "3", "--tokenizer", tokenizer_dir()]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["records"] == 60 and set(report["all"]) <= {"0", "1", "2", "3"}
    row = report["all"]["0"]
    assert row["n"] == 60 and row["n"] >= report["first"]["0"]["n"]
    assert {"mae", "r2", "kendall_tau", "log_ratio_std"} <= set(row["baseline"])
    # The baseline is the shipped proxy's total minus j*K tokens, floored at 1.
    records = sorted(read_records(small_train), key=lambda r: _hash(r.id))[:60]
    ex = window_examples(records, 50, 3, tokenizer_dir())
    base = baseline_remaining(load_predictor(default_predictor_path()),
                              [PredictInput.from_record(r) for r in records], ex, 50)
    proxy = load_predictor(default_predictor_path()).predict(
        [PredictInput.from_record(records[ex.record[-1]])])[0]
    assert base[-1] == pytest.approx(max(proxy - 50 * ex.window[-1], 1.0))
    at0 = np.asarray(ex.window) == 0
    assert row["baseline"]["mae"] == pytest.approx(
        float(np.mean(np.abs(base[at0] - ex.remaining[at0]))))


def _hash(text: str) -> str:
    import hashlib
    return hashlib.sha256(text.encode()).hexdigest()


def test_window_examples_stop_before_the_answer_ends() -> None:
    response = " ".join(f"w{i}" for i in range(400))
    records = [Record(id="a#0", messages=[Message("user", "q")], response=response,
                      output_tokens=120),
               Record(id="b#0", messages=[Message("user", "q")], response="ok", output_tokens=1)]
    ex = window_examples(records, 50, 10, tokenizer_dir())
    assert list(zip(ex.record, ex.window)) == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert ex.remaining.tolist() == [120.0, 70.0, 20.0, 1.0]
    assert ex.partial[0] == "" and response.startswith(ex.partial[2])
    assert len(ex.partial[2]) > len(ex.partial[1]) > 0


def test_log_ratio_and_the_markdown_table() -> None:
    assert log_ratio(np.asarray([10.0, 40.0]), np.asarray([20.0, 20.0])) == {
        "log_ratio_mean": pytest.approx(0.0), "log_ratio_std": pytest.approx(np.log(2))}
    metrics = {"mae": 1.25, "kendall_tau": 0.5, "r2": 0.25, "log_ratio_std": 0.5}
    report = {"all": {"0": {"n": 1200, "iterative": metrics, "baseline": metrics}}}
    lines = markdown(report, "all").splitlines()
    assert lines[0].startswith("| j | n | iterative MAE |") and "baseline σ(log)" in lines[0]
    assert lines[2] == "| 0 | 1,200 | 1.2 | 0.500 | 0.250 | 0.50 | 1.2 | 0.500 | 0.250 | 0.50 |"

