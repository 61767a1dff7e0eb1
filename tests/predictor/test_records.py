"""The record: JSONL round trip, validation, torn last lines."""

from __future__ import annotations

import pytest

from predictor.records import (
    Message,
    Record,
    read_records,
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
