"""An optional JSON-lines record of which connector hooks ran, in which process, with what.

The connector's two halves live in vLLM's engine processes, out of reach of a test's
Python objects, so what they saw is appended to a file named in the connector's extra
config (`trace_path`); nothing is written when it is unset.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import msgspec


class HookCall(msgspec.Struct, frozen=True):
    hook: str
    role: str  # "scheduler" or "worker": which half of the connector was called
    pid: int
    detail: dict[str, Any] = {}


# Per hook and process: per-layer and per-step hooks run thousands of times in a long run.
MAX_CALLS_PER_HOOK = 256


class Trace:
    def __init__(self, path: str | None, role: str) -> None:
        self._path = path
        self._role = role
        self._counts: Counter[str] = Counter()

    def __bool__(self) -> bool:
        return self._path is not None

    def record(self, hook: str, **detail: Any) -> None:
        if self._path is None or self._counts[hook] >= MAX_CALLS_PER_HOOK:
            return
        self._counts[hook] += 1
        line = msgspec.json.encode(HookCall(hook, self._role, os.getpid(), detail)) + b"\n"
        # One write per line on an O_APPEND descriptor: lines from both halves never interleave.
        fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def read_trace(path: str | os.PathLike[str]) -> list[HookCall]:
    with open(path, "rb") as file:
        return [msgspec.json.decode(line, type=HookCall) for line in file if line.strip()]
