"""The request log: one JSON line per natural completion, in the predictor's record shape
({"id", "messages", "response", "output_tokens"}), so a deployment can retrain its
predictor on what its own model says (`lengthwise predictor train --data LOG`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec


class _Record(msgspec.Struct):
    id: str
    messages: list[Any]
    response: str
    output_tokens: int


class RequestLog:
    def __init__(self, path: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "ab")  # noqa: SIM115 - kept open for the daemon's life
        self._encoder = msgspec.json.Encoder()

    def append(self, job_id: str, messages: list[Any], response: str, output_tokens: int) -> None:
        # One write per line: a crash tears at most the last line, which readers skip.
        self._file.write(self._encoder.encode(_Record(job_id, messages, response,
                                                      output_tokens)) + b"\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
