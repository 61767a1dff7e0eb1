"""Record shape from the data CLI (all turns, output token counts) and JSONL round trip."""

from __future__ import annotations

import pytest

from predictor.dataset import TokenCounter, turns_of
from predictor.records import Message, Record, read_records, write_records
from tests.predictor.conftest import tokenizer_dir


def test_record_shape(small_train) -> None:
    records = list(read_records(small_train))
    assert len(records) == 600
    counter = TokenCounter(tokenizer_dir())
    for r in records[:50]:
        assert r.messages[-1].role == "user"
        assert all(m.role in ("user", "assistant", "system") for m in r.messages)
        assert r.response.strip()
        assert r.output_tokens == counter.count_batch([r.response])[0]
    assert any(len(r.messages) > 1 for r in records), "later rounds must be included"


def test_every_round_becomes_a_record() -> None:
    conv = {"id": "c", "conversations": [
        {"from": "system", "value": "be brief"}, {"from": "human", "value": "q1"},
        {"from": "gpt", "value": "a1"}, {"from": "human", "value": "q2"},
        {"from": "gpt", "value": "a2"}, {"from": "gpt", "value": "dangling"}]}
    turns = list(turns_of(conv))
    assert [(len(m), resp, idx) for m, resp, idx in turns] == [(2, "a1", 2), (4, "a2", 4)]
    assert [m.role for m in turns[1][0]] == ["system", "user", "assistant", "user"]


def test_round_trip_and_validation(tmp_path) -> None:
    rec = Record(id="x#1", messages=[Message("user", "hi")], response="yo", output_tokens=1)
    path = tmp_path / "r.jsonl"
    assert write_records(path, [rec, rec]) == 2
    assert list(read_records(path)) == [rec, rec]
    path.write_text('{"id": "y", "messages": [{"role": "assistant", "content": "a"}], '
                    '"response": "b", "output_tokens": 1}\n')
    with pytest.raises(ValueError, match="user turn"):
        list(read_records(path))


def test_request_log_is_resplit_and_recounted(tmp_path) -> None:
    from predictor.cli import main
    from predictor.dataset import Split, split_of

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


def test_torn_last_line_is_skipped_with_a_warning(tmp_path, caplog) -> None:
    rec = Record(id="x#1", messages=[Message("user", "hi")], response="yo", output_tokens=1)
    path = tmp_path / "log.jsonl"
    write_records(path, [rec, rec])
    with open(path, "ab") as f:
        f.write(b'{"id": "x#2", "messages": [{"role": "us')  # a crash mid-write
    with caplog.at_level("WARNING", logger="predictor.records"):
        assert list(read_records(path)) == [rec, rec]
    assert "torn last line" in caplog.text and ":3:" in caplog.text
    with open(path, "ab") as f:
        f.write(b"\n\n")  # blank lines after it: still the last record line
    assert list(read_records(path)) == [rec, rec]
    with open(path, "ab") as f:
        f.write(b'{"id": "x#3", "messages": [{"role": "user", "content": "q"}], '
                b'"response": "a", "output_tokens": 1}\n')
    with pytest.raises(ValueError, match=":3: bad record"):  # not the last line: corrupt
        list(read_records(path))


def test_train_on_the_daemons_request_log(small_train, tmp_path, caplog) -> None:
    """`predictor train --data LOG` on a log written by the daemon's own RequestLog, with a
    torn last line (the daemon was killed mid-write)."""
    from daemon.requestlog import RequestLog
    from predictor import PredictInput, load_predictor
    from predictor.cli import main

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
