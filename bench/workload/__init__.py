"""Seeded benchmark workloads: when each request arrives, what it asks, how long its answer is.

Arrivals: Poisson, Gamma (bursty, by rate and CV) or the timestamps of a trace rescaled to a
target rate. Lengths: ShareGPT prompts with their real answer lengths (split by the reserved-
split rule), predictor records / vLLM-bench JSONL, or a trace's token counts with synthetic
prompt text of that length. The same spec and seed give the same requests, byte for byte.
"""

from __future__ import annotations

import msgspec

from bench.workload.arrivals import arrival_times
from bench.workload.lengths import draw_lengths
from bench.workload.spec import (
    Message,
    Request,
    WorkloadSpec,
    add_arguments,
    sample_label,
    spec_from_args,
    warn_sample,
)

# What the bench commands use; the modules behind them: spec (the flags and the request
# types), arrivals (when), lengths (what is asked and how long its answer is).
__all__ = ["Message", "Request", "WorkloadSpec", "add_arguments", "arrival_times", "at_rate",
           "build", "sample_label", "spec_from_args", "warn_sample"]


def build(spec: WorkloadSpec) -> list[Request]:
    """The workload: arrival times and lengths are drawn from independent seeded streams,
    so changing the rate keeps the same prompts (runs at several rates stay comparable)."""
    times = arrival_times(spec)
    shapes = draw_lengths(spec)
    return [Request(i, float(t), msgs, p, o)
            for i, (t, (msgs, p, o)) in enumerate(zip(times, shapes, strict=True))]


def at_rate(requests: list[Request], rate: float, new_rate: float) -> list[Request]:
    """The same requests at another mean rate. Exact for every arrival kind: Poisson and
    Gamma gaps are drawn at scale 1/rate and trace times are rescaled to it, so build(spec
    at new_rate) gives these times too, without drawing and tokenizing the prompts again."""
    k = rate / new_rate
    return [msgspec.structs.replace(r, arrival_s=r.arrival_s * k) for r in requests]
