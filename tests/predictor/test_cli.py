"""`lengthwise predictor data|train|eval|windows`: the commands and their options; data from a
request log; training on the daemon's own request log."""

from __future__ import annotations

import argparse

import pytest

from predictor import PredictInput, load_predictor
from predictor.cli import _levels, _parser, main
from predictor.dataset import Split, TokenCounter, is_dev, split_of
from predictor.records import Message, Record, read_records, write_records
from tests.predictor.conftest import tokenizer_dir


def test_the_four_commands_and_their_defaults() -> None:
    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == {"data", "train", "eval", "windows"}
    args = parser.parse_args(["train", "--kind", "iterative", "--data", "d", "--out", "o"])
    assert (args.rank_weight, args.rank_loss, args.quantiles) == (None, "listnet", (0.1, 0.5, 0.9))
    assert (args.window, args.max_windows, args.dev_limit) == (50, 12, 2000)
    args = parser.parse_args(["windows", "--model", "m", "--data", "d"])
    assert (args.baseline, args.max_windows, args.dev) == ("", 10, False)


def test_quantile_levels_are_parsed_sorted_and_checked(capsys) -> None:
    assert _levels("0.9, 0.1,0.5") == (0.1, 0.5, 0.9)
    assert _levels("") == ()
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--kind", "proxy", "--data", "d", "--out", "o", "--quantiles", "0.5,1"])
    assert exit_info.value.code == 2 and "quantile levels must be in (0, 1)" in capsys.readouterr().err


def test_data_from_a_log_needs_its_file(tmp_path) -> None:
    with pytest.raises(SystemExit, match="--source log needs --input"):
        main(["data", "--source", "log", "--split", "train", "--tokenizer", tokenizer_dir(),
              "--out", str(tmp_path / "x.jsonl")])


def test_request_log_is_resplit_and_recounted(tmp_path) -> None:
    ids = [f"req-{i}" for i in range(40)]
    log = tmp_path / "log.jsonl"
    write_records(log, [Record(id=i, messages=[Message("user", "q")], response="a b c",
                               output_tokens=999) for i in ids])
    out = tmp_path / "train.jsonl"
    assert main(["data", "--source", "log", "--input", str(log), "--split", "train",
                 "--tokenizer", tokenizer_dir(), "--out", str(out)]) == 0
    kept = list(read_records(out))
    assert [r.id for r in kept] == [i for i in ids if split_of(i) is Split.TRAIN]
    assert all(r.output_tokens == TokenCounter(tokenizer_dir()).count_batch(["a b c"])[0]
               for r in kept)


def test_train_on_the_daemons_request_log(small_train, tmp_path, caplog) -> None:
    """`predictor train --data LOG` on a log written by the daemon's own RequestLog, with a
    torn last line (the daemon was killed mid-write)."""
    from daemon.requestlog import RequestLog

    log_path = tmp_path / "requests.jsonl"
    log = RequestLog(str(log_path))
    records = list(read_records(small_train))[:300]
    for i, r in enumerate(records):
        log.append(f"chatcmpl-{i:04x}", list(r.messages), r.response, r.output_tokens)
    log.close()
    with open(log_path, "ab") as f:
        f.write(b'{"id":"chatcmpl-torn","messages":[{"role":"user","cont')
    out = tmp_path / "from_log"
    with caplog.at_level("WARNING", logger="predictor.records"):
        assert main(["train", "--kind", "proxy", "--data", str(log_path), "--out", str(out),
                     "--epochs", "1", "--dev-limit", "0"]) == 0
    assert "torn last line" in caplog.text
    predictor = load_predictor(out)
    got = predictor.predict_quantiles([PredictInput.from_record(records[0])])
    assert 1.0 <= got[0][0] <= got[0][1]


def test_train_without_a_dev_hold_out(small_train, tmp_path, capsys) -> None:
    """A small request log can hold no record of the dev hold-out (1/8 of the training side,
    by id): proxy and iterative train without dev metrics and say so; retrieval, which tunes
    on dev, refuses by name before any work; an empty file is refused."""
    records = [r for r in read_records(small_train) if not is_dev(r.id)][:40]
    data = tmp_path / "no_dev.jsonl"
    write_records(data, records)
    for kind in ("proxy", "iterative"):
        out = tmp_path / kind
        assert main(["train", "--kind", kind, "--data", str(data), "--out", str(out),
                     "--epochs", "1", "--dev-limit", "0", "--tokenizer", tokenizer_dir()]) == 0
        assert "without dev metrics" in capsys.readouterr().err
        predictor = load_predictor(out)
        assert predictor.manifest.dev_metrics == {}
        assert predictor.predict([PredictInput.from_record(records[0])])[0] >= 1.0
    assert main(["train", "--kind", "retrieval", "--data", str(data),
                 "--out", str(tmp_path / "retrieval")]) == 2
    assert "dev hold-out" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["train", "--kind", "proxy", "--data", str(empty), "--out", str(tmp_path / "e")]) == 2
    assert "no training records" in capsys.readouterr().err
