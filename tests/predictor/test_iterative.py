"""Iterative predictor: trains on K-token windows, predicts remaining tokens, per-window eval."""

from __future__ import annotations

import json

import numpy as np
import pytest

from predictor import PredictInput, load_predictor
from predictor.cli import main
from predictor.iterative import baseline_remaining, window_examples
from predictor.records import read_records
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
    assert remaining[0] == total and all(r >= 1.0 for r in remaining)
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
