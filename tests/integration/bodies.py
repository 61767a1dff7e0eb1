"""Server answers as comparable bodies: a stream merged into one body, each streamed tool
call's deltas joined, and where two bodies differ (tests/integration/test_differential.py
compares lengthwise's with vLLM's server's)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

# Differ by design: ids, clocks, vLLM's version stamp.
IGNORED = {"id", "created", "system_fingerprint"}
TOLERANCE = 1e-3


def merge(into: Any, piece: Any) -> Any:
    """A stream's pieces as one body: strings concatenated, lists extended, the rest replaced
    (None never replaces)."""
    if piece is None:
        return into
    if isinstance(into, str) and isinstance(piece, str):
        return into + piece
    if isinstance(into, list) and isinstance(piece, list):
        return into + piece
    if isinstance(into, dict) and isinstance(piece, dict):
        merged = dict(into)
        for key, value in piece.items():
            merged[key] = merge(merged.get(key), value)
        return merged
    return piece


def merge_stream(lines: Iterator[str]) -> dict[str, Any]:
    merged: dict[str, Any] = {"choices": {}}
    for line in lines:
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        assert "error" not in chunk, chunk
        for choice in chunk.pop("choices"):
            index = choice["index"]
            merged["choices"][index] = merge(merged["choices"].get(index), choice)
        for key, value in chunk.items():  # usage, model, ...: the last; token id lists grow
            if value is not None:
                merged[key] = merge(merged.get(key), value) if isinstance(value, list) \
                    else value
    merged["choices"] = [merged["choices"][i] for i in sorted(merged["choices"])]
    return merged


def differences(want: Any, got: Any, path: str = "",
                ignored: frozenset[str] | set[str] = IGNORED) -> list[str]:
    """Where `got` differs from `want` (a missing key equals null; floats to TOLERANCE)."""
    if isinstance(want, dict) and isinstance(got, dict):
        return [d for key in sorted(want.keys() | got.keys()) if key not in ignored
                for d in differences(want.get(key), got.get(key), f"{path}.{key}", ignored)]
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{path}: {len(want)} items, got {len(got)}: {want!r} vs {got!r}"]
        return [d for k, (a, b) in enumerate(zip(want, got, strict=True))
                for d in differences(a, b, f"{path}[{k}]", ignored)]
    if isinstance(want, float) and isinstance(got, float | int) and \
            not isinstance(got, bool):
        return [] if abs(want - got) <= TOLERANCE else [f"{path}: {want} vs {got}"]
    return [] if want == got else [f"{path}: {want!r} vs {got!r}"]


def calls_whole(body: dict[str, Any]) -> dict[str, Any]:
    """A merged stream with each tool call's deltas as one (its arguments joined): how many
    deltas a call comes in is how the server's steps met its reads (vLLM's server merges
    the outputs of steps its stream had not read yet; one run of the differential saw 8 deltas
    from it against lengthwise's 9), not an answer. What the deltas add up to must agree, and
    test_differential's tool test checks they were several."""
    choices = []
    for choice in body.get("choices", []):
        deltas = (choice.get("delta") or {}).get("tool_calls")
        if deltas:
            calls: dict[int, dict[str, Any]] = {}
            for delta in deltas:
                if delta["index"] not in calls:
                    calls[delta["index"]] = copy.deepcopy(delta)
                    continue
                function = calls[delta["index"]]["function"]
                function["arguments"] = (function.get("arguments") or "") + \
                    (delta["function"].get("arguments") or "")
            choice = {**choice, "delta": {**choice["delta"], "tool_calls": list(calls.values())}}
        choices.append(choice)
    return {**body, "choices": choices}
