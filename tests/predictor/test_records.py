"""The record: JSONL round trip, validation, torn last lines; conversation text."""

from __future__ import annotations

import pytest

from predictor.records import (
    Message,
    Record,
    conversation_key,
    current_prompt,
    is_first_turn,
    read_records,
    render,
    write_records,
)


def test_round_trip_and_validation(tmp_path) -> None:
    rec = Record(id="x#1", messages=[Message("user", "hi")], response="yo", output_tokens=1)
    path = tmp_path / "r.jsonl"
    assert write_records(path, [rec, rec]) == 2
    assert list(read_records(path)) == [rec, rec]
    path.write_text('{"id": "y", "messages": [{"role": "assistant", "content": "a"}], '
                    '"response": "b", "output_tokens": 1}\n')
    with pytest.raises(ValueError, match="user turn"):
        list(read_records(path))


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


def test_write_leaves_no_temp_file(tmp_path) -> None:
    path = tmp_path / "r.jsonl"
    assert write_records(path, []) == 0
    assert path.read_bytes() == b"" and [p.name for p in tmp_path.iterdir()] == ["r.jsonl"]


def test_conversation_text_is_role_tagged_oldest_first() -> None:
    turns = [Message("system", "be brief"), Message("user", "q1"), Message("assistant", "a1"),
             Message("user", "q2")]
    assert render(turns) == "system: be brief\nuser: q1\nassistant: a1\nuser: q2"
    assert current_prompt(turns) == "q2" and current_prompt([]) == ""


def test_conversation_key_and_first_turn() -> None:
    assert conversation_key("abc#3") == "abc"
    assert conversation_key("a#b#2") == "a#b"
    assert conversation_key("chatcmpl-1") == "chatcmpl-1"
    first = Record(id="c#1", messages=[Message("system", "s"), Message("user", "q")],
                   response="a", output_tokens=1)
    later = Record(id="c#3", messages=[*first.messages, Message("assistant", "a"),
                                       Message("user", "q2")], response="b", output_tokens=1)
    assert is_first_turn(first) and not is_first_turn(later)
