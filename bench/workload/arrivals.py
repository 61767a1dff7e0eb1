"""When each request arrives: Poisson, Gamma (bursty, by rate and CV) or a trace's timestamps
rescaled to the target rate. Reads the trace (Azure LLM inference CSV) for the lengths too."""

from __future__ import annotations

import csv
import datetime as dt
from pathlib import Path

import numpy as np

from bench.workload.spec import WorkloadSpec


def arrival_times(spec: WorkloadSpec) -> np.ndarray:
    rng = np.random.default_rng([spec.seed, 1])
    if spec.num <= 0:
        return np.zeros(0)
    if spec.rate <= 0:
        raise ValueError("--rate must be > 0")
    kind, _, path = spec.arrivals.partition(":")
    if kind == "poisson":
        gaps = rng.exponential(1.0 / spec.rate, spec.num)
    elif kind == "gamma":
        shape = 1.0 / spec.cv**2
        gaps = rng.gamma(shape, 1.0 / (spec.rate * shape), spec.num)
    elif kind == "trace" and path:
        return _trace_times(Path(path), spec)
    else:
        raise ValueError(f"unknown arrivals {spec.arrivals!r}: poisson | gamma | trace:PATH")
    return np.cumsum(gaps) - gaps[0]  # the first request arrives at t = 0


def trace_window(total: int, num: int, seed: int) -> int:
    """First row of the num consecutive rows a trace contributes; the same for the trace's
    arrivals and lengths, so a trace used for both keeps its rows paired."""
    if num >= total:
        return 0
    return int(np.random.default_rng([seed, 2]).integers(0, total - num + 1))


def read_trace(path: Path) -> list[tuple[float, int, int]]:
    """(seconds since the trace's first row, context tokens, generated tokens) per row."""
    rows = []
    with path.open() as f:
        for row in csv.DictReader(f):
            rows.append((_seconds(row["TIMESTAMP"]), int(row["ContextTokens"]),
                         int(row["GeneratedTokens"])))
    if not rows:
        raise ValueError(f"{path}: empty trace")
    t0 = rows[0][0]
    return [(t - t0, c, g) for t, c, g in rows]


def _seconds(stamp: str) -> float:
    # "2023-11-16 18:17:03.9799600": 7 fractional digits, more than fromisoformat takes.
    whole, _, frac = stamp.strip().partition(".")
    base = dt.datetime.fromisoformat(whole).replace(tzinfo=dt.UTC).timestamp()
    return base + (float("0." + frac) if frac else 0.0)


def _trace_times(path: Path, spec: WorkloadSpec) -> np.ndarray:
    rows = read_trace(path)
    start = trace_window(len(rows), spec.num, spec.seed)
    window = rows[start:start + spec.num]
    times = np.array([t for t, _, _ in window]) - window[0][0]
    if len(times) < spec.num:  # a short trace repeats, shifted past its end
        period = times[-1] + (times[-1] / max(len(times) - 1, 1))
        reps = -(-spec.num // len(times))
        times = np.concatenate([times + k * period for k in range(reps)])[:spec.num]
    span = times[-1] - times[0]
    if span > 0 and len(times) > 1:
        times = times * (((len(times) - 1) / span) / spec.rate)  # mean rate -> spec.rate
    return times