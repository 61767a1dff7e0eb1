"""The fleet's table, JSON and plot: throughput against linear scaling, latency per
placement, and the dispatcher's decision-round cost as the fleet grows."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import msgspec
import numpy as np

from bench.fleet.run import FleetPoint

BASELINE = "least_queue"  # the EPP's default scorer: lengthwise's placement is compared to it


class FleetResults(msgspec.Struct, kw_only=True):
    policy: str
    predictor: str
    profile: str
    max_running: int  # slots per executor
    arrivals: str
    lengths: str
    # Requests per executor (size N serves the first N x per_executor of the window); None:
    # every size serves the same `num` requests.
    per_executor: int | None = None
    num: int = 0  # requests in the trace window built (the largest size's, per executor)
    load: float  # offered rate / measured capacity, per executor
    capacity_rps: float  # one executor's completed req/s under a backlog (FCFS)
    per_executor_rps: float  # load x capacity: the rate each size is scaled by
    points: list[FleetPoint]


def vs_linear(points: Sequence[FleetPoint]) -> dict[tuple[int, str], float]:
    """Completed req/s / (N x the per-executor req/s of the same system's smallest fleet)."""
    out = {}
    for p in points:
        base = min((q for q in points if q.label == p.label), key=lambda q: q.executors)
        linear = base.steady_rps / base.executors * p.executors
        out[(p.executors, p.label)] = p.steady_rps / linear
    return out


def vs_baseline(points: Sequence[FleetPoint]) -> dict[tuple[int, str], float]:
    """Mean JCT / least-queue's of the same binding and size (nan without one)."""
    base = {(p.executors, p.binding): p.summary.mean_jct for p in points
            if p.placement == BASELINE}
    return {(p.executors, p.label): p.summary.mean_jct
            / base.get((p.executors, p.binding), math.nan) for p in points}


def saturation_size(points: Sequence[FleetPoint], label: str, share: str = "dispatcher_busy"
                    ) -> tuple[float, float]:
    """(N where `share` (CPU s per simulated s) would reach one whole core, exponent b) from
    a fit of share = a N^b over the measured sizes; (nan, nan) with fewer than 2 sizes."""
    pts = [p for p in points if p.label == label and getattr(p, share) > 0]
    if len({p.executors for p in pts}) < 2:
        return math.nan, math.nan
    b, log_a = np.polyfit(np.log([p.executors for p in pts]),
                          np.log([getattr(p, share) for p in pts]), 1)
    log_n = -log_a / b if b > 0 else math.inf
    # A nearly flat fit (CPU share barely grows with N) puts the core's saturation beyond
    # any float: report it as infinite.
    return (math.exp(log_n) if log_n < 700 else math.inf), float(b)


def table(res: FleetResults) -> str:
    lin, rel = vs_linear(res.points), vs_baseline(res.points)
    head = ("| executors | binding:placement | offered req/s | req/s | out tok/s | vs linear "
            "| vs arrivals "
            "| mean JCT s | p99 JCT s | mean TTFT s | p99 TTFT s | mean JCT vs least_queue "
            "| rounds/sim s | CPU µs/round mean (p99) | dispatcher busy | sim wall s "
            "| sim CPU s/sim s |")
    lines = [head, "|" + "---|" * 17]
    for p in sorted(res.points, key=lambda q: (q.executors, q.label)):
        s, key = p.summary, (p.executors, p.label)
        lines.append(
            f"| {p.executors} | {p.label} | {p.offered_rps:.1f} | {p.steady_rps:.1f} "
            f"| {p.steady_tps:.0f} | {lin[key]:.3f} | {p.steady_rps / p.window_arrival_rps:.3f} "
            f"| {s.mean_jct:.2f} | {s.p99_jct:.2f} "
            f"| {s.mean_ttft:.2f} | {s.p99_ttft:.2f} | {rel[key]:.2f}x "
            f"| {p.rounds / p.virtual_s:.0f} | {p.round_cpu_mean_us:.0f} "
            f"({p.round_cpu_p99_us:.0f}) | {100 * p.dispatcher_busy:.2f} % "
            f"| {p.wall_s:.1f} | {p.cpu_per_virtual_s:.3f} |")
    return "\n".join(lines)


def title(res: FleetResults) -> str:
    return (f"{res.policy} ({res.predictor}), {res.profile}, {res.max_running} slots per "
            f"executor, {res.arrivals.rsplit('/', 1)[-1]}; load {res.load:g} of "
            f"{res.capacity_rps:.3g} req/s per executor ({res.per_executor_rps:.3g} req/s); "
            + (f"{res.per_executor} requests per executor" if res.per_executor else
               f"the same {res.num} requests at every size"))


def summary_lines(res: FleetResults) -> list[str]:
    lines = []
    what = (("dispatcher_busy", "its decision rounds"),
            ("cpu_per_virtual_s", "the whole simulation (core, policy, token path, engines)"))
    for label in sorted({p.label for p in res.points}):
        for share, name in what:
            n, b = saturation_size(res.points, label, share)
            where = f"~{n:.0f}" if n < 1e5 else "over 100,000"
            lines.append(f"{label}: {name} would fill one core at {where} executors per "
                         f"daemon (CPU ~ N^{b:.2f}, fitted over the sizes run)")
    return lines


def plot(res: FleetResults, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    lin = vs_linear(res.points)
    for label in sorted({p.label for p in res.points}):
        pts = sorted((p for p in res.points if p.label == label), key=lambda p: p.executors)
        ns = [p.executors for p in pts]
        axes[0].plot(ns, [lin[(p.executors, label)] for p in pts], marker="o", label=label)
        axes[1].plot(ns, [p.summary.mean_jct for p in pts], marker="o", label=label)
        axes[2].plot(ns, [100 * p.dispatcher_busy for p in pts], marker="o", label=label)
    axes[0].axhline(0.9, color="grey", lw=0.5, ls="--")
    axes[0].set(xlabel="executors", ylabel="req/s / linear", title="throughput vs linear")
    axes[1].set(xlabel="executors", ylabel="s", title="mean JCT")
    axes[2].set(xlabel="executors", ylabel="% of one core", title="decision rounds, per daemon")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title(res), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
