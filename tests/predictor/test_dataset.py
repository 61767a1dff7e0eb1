"""The reserved-split rule (DESIGN.md) and the dev hold-out, records from ShareGPT and request
logs with their output tokens, and loading the training side as train + dev."""

from __future__ import annotations

import hashlib

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from predictor.dataset import (
    Split,
    TokenCounter,
    build_records,
    chars_per_token,
    is_dev,
    iter_conversations,
    lengths,
    load_sharegpt_text,
    load_train_dev,
    log_pairs,
    sharegpt_pairs,
    split_of,
    turns_of,
)
from predictor.records import Message, Record, read_records, write_records
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


def test_build_records_counts_every_pair_across_batches() -> None:
    counter = TokenCounter(tokenizer_dir())
    pairs = [(f"c#{i}", [Message("user", "q")], "word " * (i + 1)) for i in range(5)]
    records = list(build_records(iter(pairs), counter, batch=2))
    assert [r.id for r in records] == [p[0] for p in pairs]
    assert [r.output_tokens for r in records] == counter.count_batch([p[2] for p in pairs])


def test_token_counter_prefixes_cut_at_every_k_tokens() -> None:
    counter = TokenCounter(tokenizer_dir())
    text = " ".join(f"w{i}" for i in range(200))
    total = counter.count_batch([text])[0]
    cuts = counter.prefixes(text, 20, 3)
    assert len(cuts) == 3 and total > 60
    assert all(text.startswith(c) for c in cuts)
    assert len(counter.prefixes(text, 20, 1000)) == (total - 1) // 20  # never the whole text


def test_log_pairs_keep_only_the_split(tmp_path) -> None:
    ids = [f"req-{i}#0" for i in range(30)]
    path = tmp_path / "log.jsonl"
    write_records(path, [Record(id=i, messages=[Message("user", "q")], response="a",
                                output_tokens=1) for i in ids])
    train = [rid for rid, _, _ in log_pairs(path, Split.TRAIN)]
    test = [rid for rid, _, _ in log_pairs(path, Split.TEST)]
    assert sorted(train + test) == sorted(ids)
    assert all(split_of(i.split("#")[0]) is Split.TRAIN for i in train)


def test_load_train_dev_drops_the_reserved_split_and_holds_out_dev(tmp_path, capsys) -> None:
    ids = [f"conv{i}#0" for i in range(200)]
    path = tmp_path / "records.jsonl"
    write_records(path, [Record(id=i, messages=[Message("user", "q")], response="abcd" * n,
                                output_tokens=n) for n, i in enumerate(ids, 1)])
    data = load_train_dev(path)
    reserved = [i for i in ids if split_of(i.split("#")[0]) is Split.TEST]
    assert f"dropped {len(reserved)} records" in capsys.readouterr().err
    assert {r.id for r in data.dev} == {i for i in ids if i not in reserved and is_dev(i)}
    assert len(data.train) + len(data.dev) + len(reserved) == len(ids)
    limited = load_train_dev(path, limit=5, dev_limit=2)
    assert [r.id for r in limited.train] == [r.id for r in data.train[:5]]
    assert len(limited.dev) == 2
    assert chars_per_token(data.train) == 4.0
    assert np.array_equal(lengths(data.train), [r.output_tokens for r in data.train])
