"""Record shape from the data CLI (all turns, output token counts) and JSONL round trip."""

from __future__ import annotations

import pytest

from predictor.outtok import TokenCounter
from predictor.records import Message, Record, read_records, write_records
from predictor.sharegpt import turns_of
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
    from predictor.split import Split, split_of

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
