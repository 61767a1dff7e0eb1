"""The frontier's table, JSON and plot (mean-JCT ratio vs p99-JCT ratio to FCFS)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import msgspec

from bench.frontier.run import Outcome
from bench.frontier.systems import group_of
from bench.metrics import ratios
from bench.workload import WorkloadSpec

_COLUMNS = (("mean_jct", "mean JCT s"), ("p50_jct", "p50 JCT s"), ("p99_jct", "p99 JCT s"),
            ("mean_ttft", "mean TTFT s"), ("p99_ttft", "p99 TTFT s"))


class Row(msgspec.Struct, kw_only=True):
    system: Outcome
    vs_fcfs: dict[str, float]  # summary field -> value / FCFS's value


class FrontierResults(msgspec.Struct, kw_only=True):
    workload: WorkloadSpec  # rate: the one every system ran at
    sample: str  # held-out | in-sample | reserved-test | external
    predictor: str
    natural: bool  # jobs stop at their true length; max_tokens does not reveal it
    calibrate: float | None  # target FCFS mean JCT / unloaded mean JCT; None: --rate given
    unloaded_mean_jct: float
    fcfs_load_ratio: float  # FCFS mean JCT / unloaded mean JCT at the chosen rate
    rows: list[Row]


def rows_of(outcomes: Sequence[Outcome]) -> list[Row]:
    """outcomes[0] is the FCFS baseline."""
    base = outcomes[0].summary
    return [Row(system=o, vs_fcfs=ratios(o.summary, base, [f for f, _ in _COLUMNS]))
            for o in outcomes]


def _cell(value: float, ratio: float) -> str:
    return "–" if math.isnan(value) else f"{value:.2f} ({ratio:.2f}x)"


def table(rows: Sequence[Row]) -> str:
    head = "| system | " + " | ".join(name for _, name in _COLUMNS) + " | preempt | wall s |"
    lines = [head, "|" + "---|" * (len(_COLUMNS) + 3)]
    for r in rows:
        s = r.system.summary
        cells = [_cell(getattr(s, f), r.vs_fcfs[f]) for f, _ in _COLUMNS]
        lines.append(f"| {r.system.label} | " + " | ".join(cells)
                     + f" | {r.system.preemptions} | {r.system.wall_s:.1f} |")
    return "\n".join(lines)


def plot(rows: Sequence[Row], path: Path, title: str) -> None:
    """One point per system; systems of one group (label before its last '-') joined in
    the order given, so a knob sweep is a curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 5))
    groups: dict[str, list[Row]] = {}
    for r in rows:
        groups.setdefault(group_of(r.system.label), []).append(r)
    for name, members in groups.items():
        xs = [m.vs_fcfs["mean_jct"] for m in members]
        ys = [m.vs_fcfs["p99_jct"] for m in members]
        ax.plot(xs, ys, marker="o", linestyle="-" if len(members) > 1 else "none", label=name)
        for m, x, y in zip(members, xs, ys, strict=True):
            ax.annotate(m.system.label, (x, y), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    ax.axvline(1.0, color="grey", lw=0.5)
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set(xlabel="mean JCT / FCFS", ylabel="p99 JCT / FCFS", title=title)
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
