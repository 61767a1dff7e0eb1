"""The reserved-split rule (DESIGN.md) and the dev hold-out; records from ShareGPT with their
output tokens."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from predictor.dataset import (
    Split,
    TokenCounter,
    is_dev,
    iter_conversations,
    load_sharegpt_text,
    sharegpt_pairs,
    split_of,
    turns_of,
)
from predictor.records import read_records
from tests.predictor.conftest import tokenizer_dir


def _first_hex(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()[0]


@given(st.text(min_size=1, max_size=40))
def test_split_follows_first_hex_digit(conv_id: str) -> None:
    expected = Split.TEST if _first_hex(conv_id) in "cdef" else Split.TRAIN
    assert split_of(conv_id) is expected


def test_known_ids() -> None:
    for conv_id in ("QWJhYvA_0", "abc", "x"):
        h = _first_hex(conv_id)
        assert (split_of(conv_id) is Split.TEST) == (h in "cdef"), (conv_id, h)


def test_sharegpt_pairs_respect_split() -> None:
    text = load_sharegpt_text()
    for split in Split:
        for n, (rid, _, _) in enumerate(sharegpt_pairs(split, text)):
            assert split_of(rid.rsplit("#", 1)[0]) is split
            if n > 300:
                break


def test_data_cli_train_file_has_no_reserved_ids(small_train) -> None:
    ids = [r.id for r in read_records(small_train)]
    assert ids and all(_first_hex(i.rsplit("#", 1)[0]) not in "cdef" for i in ids)


def test_dev_holdout_keeps_conversation_parts_together() -> None:
    assert is_dev("abc_0#1") == is_dev("abc_0#5") == is_dev("abc_1#3")


def test_truncated_file_parses_whole_records_only() -> None:
    text = '[{"id": "a", "conversations": []}, {"id": "b", "conversations": [{"from": "hu'
    assert [c["id"] for c in iter_conversations(text)] == ["a"]


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
