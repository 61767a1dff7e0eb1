"""Summaries and the side-by-side table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from bench.policy_sim.overhead import Overhead
from bench.policy_sim.run import Outcome

ORACLES = ("oracle-sjf", "oracle-srpt")


@dataclass(frozen=True, slots=True)
class Summary:
    policy: str
    mean_jct_s: float
    p50_jct_s: float
    p99_jct_s: float
    mean_ttft_s: float
    p99_ttft_s: float
    throughput_rps: float
    throughput_tps: float
    preemptions: int
    slices: int  # budget yields (SCLS)
    vs_fcfs: float  # mean JCT / FCFS mean JCT
    oracle_capture: float  # share of the best oracle's mean-JCT gain over FCFS
    wall_s: float

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def summarize(outcomes: Sequence[Outcome]) -> list[Summary]:
    by_name = {o.policy: o for o in outcomes}
    fcfs = float(np.mean(by_name["fcfs"].jct_s)) if "fcfs" in by_name else float("nan")
    oracle = min((float(np.mean(by_name[n].jct_s)) for n in ORACLES if n in by_name),
                 default=float("nan"))
    rows = []
    for o in outcomes:
        mean = float(np.mean(o.jct_s))
        gain = fcfs - oracle
        rows.append(Summary(
            o.policy, mean, float(np.percentile(o.jct_s, 50)), float(np.percentile(o.jct_s, 99)),
            float(np.mean(o.ttft_s)), float(np.percentile(o.ttft_s, 99)),
            len(o.jct_s) / o.makespan_s, o.output_tokens / o.makespan_s, o.preemptions,
            o.budget_yields, mean / fcfs, (fcfs - mean) / gain if gain > 0 else float("nan"),
            o.wall_s))
    return rows


def table(rows: Sequence[Summary]) -> str:
    head = ("| policy | mean JCT s | p50 JCT s | p99 JCT s | mean TTFT s | p99 TTFT s | req/s "
            "| tok/s | preempt | slices | JCT/FCFS | oracle capture |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        lines.append(
            f"| {r.policy} | {r.mean_jct_s:.2f} | {r.p50_jct_s:.2f} | {r.p99_jct_s:.2f} "
            f"| {r.mean_ttft_s:.2f} | {r.p99_ttft_s:.2f} | {r.throughput_rps:.3f} "
            f"| {r.throughput_tps:.0f} | {r.preemptions} | {r.slices} | {r.vs_fcfs:.2f} "
            f"| {r.oracle_capture:.0%} |")
    return "\n".join(lines)


def overhead_table(rows: Sequence[Overhead]) -> str:
    head = ("| policy | rounds timed | CPU mean µs | CPU p50 µs | CPU p99 µs | CPU max µs "
            "| wall p50 µs | wall p99 µs | submit µs |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        lines.append(f"| {r.policy} | {r.rounds} | {r.mean_us:.0f} | {r.p50_us:.0f} "
                     f"| {r.p99_us:.0f} | {r.max_us:.0f} | {r.wall_p50_us:.0f} "
                     f"| {r.wall_p99_us:.0f} | {r.submit_us:.1f} |")
    return "\n".join(lines)


def targets(rows: Sequence[Summary], overheads: Sequence[Overhead]) -> list[str]:
    """The issue's targets, checked for the best predicted (non-oracle, non-FCFS) policy."""
    by_name = {r.policy: r for r in rows}
    predicted = [r for r in rows if r.policy not in (*ORACLES, "fcfs")]
    if not predicted or "fcfs" not in by_name:
        return []
    best = min(predicted, key=lambda r: r.mean_jct_s)
    fcfs = by_name["fcfs"]
    oracle = min((by_name[n].mean_jct_s for n in ORACLES if n in by_name), default=float("nan"))
    worst_overhead = max((o.p99_us for o in overheads), default=float("nan"))
    ratio = best.mean_jct_s / oracle

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    return [
        f"best predicted policy: {best.policy}",
        f"mean JCT <= 0.6 x FCFS: {best.vs_fcfs:.2f} x -> {verdict(best.vs_fcfs <= 0.6)}",
        f"within 1.25 x oracle: {ratio:.2f} x -> {verdict(ratio <= 1.25)}",
        f"p99 JCT <= FCFS: {best.p99_jct_s:.2f} vs {fcfs.p99_jct_s:.2f} s -> "
        + verdict(best.p99_jct_s <= fcfs.p99_jct_s),
        f"overhead < 1 ms per decision at 1,000 waiting (worst policy, CPU p99): "
        f"{worst_overhead:.0f} us -> " + verdict(worst_overhead < 1000),
    ]
