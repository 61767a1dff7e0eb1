"""Latency figures for the eval report (single request, batch of 32, long prompts)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np


def timed_ms(fn: Callable[[], object], repeats: int) -> np.ndarray:
    fn()  # warm-up: first calls pay for lazy allocations
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000.0)
    return np.asarray(out)


def single_request_ms(predict: Callable[[list], list], inputs: Sequence, repeats: int = 50
                      ) -> np.ndarray:
    picks = [inputs[i % len(inputs)] for i in range(repeats)]
    it = iter(picks * 2)
    return timed_ms(lambda: predict([next(it)]), repeats)


def batch_ms(predict: Callable[[list], list], inputs: Sequence, size: int = 32,
             repeats: int = 5) -> float:
    batch = [inputs[i % len(inputs)] for i in range(size)]
    return float(np.median(timed_ms(lambda: predict(batch), repeats)))


def percentiles(ms: np.ndarray) -> dict[str, float]:
    if len(ms) == 0:
        return {"p50_ms": float("nan"), "p99_ms": float("nan")}
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99))}
