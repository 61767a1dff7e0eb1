"""The request log: one line per completion, each readable as a predictor training record
as soon as it is written, appended across restarts."""

from __future__ import annotations

from pathlib import Path

from daemon.requestlog import RequestLog
from predictor.records import Message, Record, read_records

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]


def test_lines_are_predictor_records_readable_before_close(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "day1" / "requests.jsonl"  # folders made as needed
    log = RequestLog(str(path))
    try:
        log.append("chatcmpl-1", CHAT, "Hello.", 3)
        # Flushed per line: a daemon killed now has lost nothing it logged.
        assert list(read_records(path)) == [
            Record("chatcmpl-1", [Message("system", "Be brief."), Message("user", "Hi?")],
                   "Hello.", 3)]
    finally:
        log.close()


def test_a_restarted_daemon_appends_to_its_log(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    for run in range(2):
        log = RequestLog(str(path))
        log.append(f"cmpl-{run}", CHAT, f"answer {run}", 2)
        log.close()
    assert [(r.id, r.response) for r in read_records(path)] == [
        ("cmpl-0", "answer 0"), ("cmpl-1", "answer 1")]
