"""Iterative predictor: trains on K-token windows, predicts remaining tokens, per-window eval."""

from __future__ import annotations

import json

from predictor import PredictInput, load_predictor
from predictor.cli import main
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
