"""Markdown tables of bench results."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from bench.metrics import Summary


class _Run(Protocol):
    system: str
    rate: float
    summary: Summary


def _f(value: float, digits: int = 2) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def markdown_table(runs: Sequence[_Run], baseline: str = "vllm") -> str:
    """One row per (rate, system); the last column is mean JCT relative to the baseline
    system at the same rate."""
    base = {r.rate: r.summary.mean_jct for r in runs if r.system == baseline}
    lines = [("| rate (req/s) | system | done/failed | mean JCT (s) | p50 | p95 | p99 JCT (s) "
             "| mean TTFT (s) | p99 TTFT | mean TPOT (ms) | req/s | tok/s | norm lat (ms/tok) "
             f"| mean JCT vs {baseline} |"),
             "|---" * 14 + "|"]
    for r in sorted(runs, key=lambda r: (r.rate, r.system)):
        s = r.summary
        ref = base.get(r.rate)
        rel = f"{(s.mean_jct / ref - 1) * 100:+.1f} %" if ref else "–"
        lines.append(
            f"| {r.rate:g} | {r.system} | {s.n_completed}/{s.n_failed} | {_f(s.mean_jct)} "
            f"| {_f(s.p50_jct)} | {_f(s.p95_jct)} | {_f(s.p99_jct)} | {_f(s.mean_ttft)} "
            f"| {_f(s.p99_ttft)} | {_f(s.mean_tpot * 1000, 1)} | {_f(s.throughput_rps)} "
            f"| {_f(s.throughput_tps, 0)} | {_f(s.norm_latency * 1000, 1)} | {rel} |")
    return "\n".join(lines) + "\n"
