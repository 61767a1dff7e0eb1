"""Training / eval examples for the iterative predictor: one per K-token window of an answer."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from predictor.dataset import TokenCounter
from predictor.records import Record


@dataclass(slots=True)
class WindowExamples:
    record: list[int]  # index of the source record
    window: list[int]  # j: the partial answer holds the first j*K tokens
    partial: list[str]
    remaining: np.ndarray  # true remaining tokens (>= 1)


def window_examples(records: list[Record], window: int, max_windows: int,
                    tokenizer_dir: str) -> WindowExamples:
    """j = 0 (prompt only) up to the last window that still leaves >= 1 token to generate."""
    counter = TokenCounter(tokenizer_dir)
    out = WindowExamples(record=[], window=[], partial=[], remaining=np.zeros(0))
    remaining: list[int] = []
    for i, r in enumerate(records):
        prefixes = [""] + counter.prefixes(r.response, window, max_windows)
        for j, partial in enumerate(prefixes):
            if r.output_tokens - j * window < 1:
                break
            out.record.append(i)
            out.window.append(j)
            out.partial.append(partial)
            remaining.append(r.output_tokens - j * window)
    out.remaining = np.asarray(remaining, dtype=np.float64)
    return out
