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


def _cell(run: _Run, field: str, scale: float = 1.0, digits: int = 2) -> str:
    """The value; with repetitions, the median and its min-max (`Aggregate.spread`)."""
    value = _f(getattr(run.summary, field) * scale, digits)
    spread = getattr(run, "spread", {}).get(field)
    if spread is None or getattr(run, "repeats", 1) < 2:
        return value
    return f"{value} ({_f(spread.min * scale, digits)}–{_f(spread.max * scale, digits)})"


def markdown_table(runs: Sequence[_Run], baseline: str = "vllm") -> str:
    """One row per (rate, system); the last column is mean JCT relative to the baseline
    system at the same rate. Repeated runs (aggregates) show median (min–max) of the
    headline metrics."""
    base = {r.rate: r.summary.mean_jct for r in runs if r.system == baseline}
    lines = [("| rate (req/s) | system | done/failed | mean JCT (s) | p50 | p95 | p99 JCT (s) "
             "| mean TTFT (s) | p50 TTFT | p99 TTFT | mean TPOT (ms) | req/s | tok/s | norm lat (ms/tok) "
             f"| goodput (req/s) | 429s | mean JCT vs {baseline} |"),
             "|---" * 17 + "|"]
    for r in sorted(runs, key=lambda r: (r.rate, r.system)):
        s = r.summary
        ref = base.get(r.rate)
        rel = f"{(s.mean_jct / ref - 1) * 100:+.1f} %" if ref else "–"
        lines.append(
            f"| {r.rate:g} | {r.system} | {s.n_completed}/{s.n_failed} | {_cell(r, 'mean_jct')} "
            f"| {_cell(r, 'p50_jct')} | {_f(s.p95_jct)} | {_cell(r, 'p99_jct')} "
            f"| {_cell(r, 'mean_ttft')} | {_cell(r, 'p50_ttft')} | {_cell(r, 'p99_ttft')} | {_f(s.mean_tpot * 1000, 1)} "
            f"| {_cell(r, 'throughput_rps')} | {_cell(r, 'throughput_tps', digits=0)} "
            f"| {_f(s.norm_latency * 1000, 1)} | {_cell(r, 'goodput_rps')} | {_refused(r)} "
            f"| {rel} |")
    return "\n".join(lines) + "\n"


class _Spread(Protocol):
    median: float
    min: float
    max: float


def _refused(run: _Run) -> str:
    """429s: as the client saw them, or as the server counted them where it counted more
    (vLLM's client records a 429 without a reason)."""
    server = getattr(run, "server_refused", None)
    if server is None or server.max <= run.summary.n_refused:
        return f"{run.summary.n_refused}"
    return _count(server)


def _count(spread: _Spread | None) -> str:
    if spread is None:
        return "–"
    if spread.min == spread.max:
        return f"{spread.median:g}"
    return f"{spread.median:g} ({spread.min:g}–{spread.max:g})"


def ratio_table(runs: Sequence[_Run], baseline: str = "vllm") -> str:
    """Per (rate, system): medians as ratios to the baseline's medians at the same rate
    (mean TTFT, mean and p99 JCT, output tokens/s), and the engine's own preemptions
    (vLLM's vllm:num_preemptions_total) and lengthwise's policy preemptions, median
    (min-max) over repetitions."""
    base = {r.rate: r.summary for r in runs if r.system == baseline}
    header = (f"| rate (req/s) | system | mean TTFT vs {baseline} | mean JCT vs {baseline} "
              f"| p99 JCT vs {baseline} | tok/s vs {baseline} | engine preemptions "
              "| policy preemptions |")
    lines = [header, "|---" * 8 + "|"]
    for r in sorted(runs, key=lambda r: (r.rate, r.system)):
        ref, s = base.get(r.rate), r.summary

        def rel(field: str, s: Summary = s, ref: Summary | None = ref) -> str:
            value, den = getattr(s, field), getattr(ref, field) if ref else None
            return f"{value / den:.2f}x" if den else "–"

        lines.append(f"| {r.rate:g} | {r.system} | {rel('mean_ttft')} | {rel('mean_jct')} "
                     f"| {rel('p99_jct')} | {rel('throughput_tps')} "
                     f"| {_count(getattr(r, 'engine_preemptions', None))} "
                     f"| {_count(getattr(r, 'policy_preemptions', None))} |")
    return "\n".join(lines) + "\n"
