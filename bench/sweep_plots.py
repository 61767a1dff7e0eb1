"""The curves of `lengthwise bench sweep` (matplotlib, Agg): figures against load, one line
per system, the median with min-max error bars over repetitions; and each system's ratios
to the baseline pair by pair (same load, same draw), with the engines' step-time ratio."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from bench.sweepstats import (
    ATTAINED,
    RATIO_FIGURES,
    Point,
    SweepRun,
    SystemCapacity,
    figure_ratio,
    geomean,
    paired,
    step_ratio,
)

_LATENCY = (("mean_ttft", "mean TTFT (s)"), ("p99_ttft", "p99 TTFT (s)"),
            ("mean_jct", "mean JCT (s)"), ("p99_jct", "p99 JCT (s)"))
_ENGINE = (("step_s", "engine step time (s, the client's)"),
           ("engine_preemptions", "engine preemptions"),
           ("policy_preemptions", "lengthwise preemptions"))


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _curve(ax: Axes, points: Sequence[Point], system: str, figure: str,
           scale: float = 1.0) -> None:
    mine = [p for p in points if p.system == system and figure in p.figures]
    if not mine:
        return
    mid = [p.figures[figure].median * scale for p in mine]
    low = [m - p.figures[figure].min * scale for m, p in zip(mid, mine, strict=True)]
    high = [p.figures[figure].max * scale - m for m, p in zip(mid, mine, strict=True)]
    ax.errorbar([p.load for p in mine], mid, yerr=[low, high], marker="o", capsize=3,
                label=system)


def _panels(points: Sequence[Point], figures: Sequence[tuple[str, str]], path: Path,
            xlabel: str, columns: int = 2) -> Path:
    rows = math.ceil(len(figures) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5.5 * columns, 4 * rows), squeeze=False)
    systems = list(dict.fromkeys(p.system for p in points))
    for ax, (figure, label) in zip(axes.flat, figures, strict=False):
        for system in systems:
            _curve(ax, points, system, figure)
        ax.set(xlabel=xlabel, ylabel=label)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(figures):]:
        ax.set_visible(False)
    # on the first panel with a curve (a client without token times draws no step times)
    next((ax for ax in axes.flat if ax.get_legend_handles_labels()[0]), axes[0][0]).legend(
        fontsize=8)
    return _save(fig, path)


def _attainment(points: Sequence[Point], caps: Sequence[SystemCapacity], path: Path,
                xlabel: str) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for system in dict.fromkeys(p.system for p in points):
        _curve(ax, points, system, "attainment", 100)
    ax.axhline(ATTAINED * 100, color="grey", linestyle="--", linewidth=1)
    for k, cap in enumerate(caps):
        ax.axvline(cap.spread.median, color=f"C{k}", linestyle=":", linewidth=1)
    ax.set(xlabel=xlabel, ylabel="attainment (% of sent, refusals missed)",
           title="SLO attainment (dotted: each system's SLO capacity, median)")
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


_RATIOS = tuple(zip(RATIO_FIGURES, ("mean TTFT", "p99 TTFT", "mean TPOT", "mean JCT",
                                     "p99 JCT"), strict=True))


def _paired(runs: Sequence[SweepRun], baseline: str, system: str, figure: str
            ) -> dict[float, list[float]]:
    """load -> the system's ratios to the baseline at that load, one per repetition
    (figure "step": the engines' step-time ratio at matched batch sizes)."""
    out: dict[float, list[float]] = {}
    for run, ref in paired(runs, baseline):
        ratio = step_ratio(run, ref) if figure == "step" else figure_ratio(run, ref, figure)
        if run.system == system and ratio > 0:  # not nan: nothing completed, or untimed
            out.setdefault(run.load, []).append(ratio)
    return out


def _ratios(runs: Sequence[SweepRun], baseline: str, path: Path, xlabel: str) -> Path:
    """One panel per figure: each pair's ratio (dots) and their geometric mean per load
    (line), log scale, 1.0 and 1.05 marked; the last panel the engines' step-time ratio."""
    systems = [s for s in dict.fromkeys(r.system for r in runs) if s != baseline]
    fig, axes = plt.subplots(2, 3, figsize=(16.5, 8), squeeze=False)
    panels = (*_RATIOS, ("step", "engine step time"))
    for ax, (figure, label) in zip(axes.flat, panels, strict=True):
        for k, system in enumerate(systems):
            by_load = _paired(runs, baseline, system, figure)
            loads = sorted(by_load)
            ax.scatter([x for x in loads for _ in by_load[x]],
                       [v for x in loads for v in by_load[x]], color=f"C{k + 1}", alpha=0.45,
                       s=18)
            ax.plot(loads, [geomean(by_load[x]) for x in loads], color=f"C{k + 1}",
                    marker="o", label=system)
        ax.axhline(1.0, color="grey", linewidth=1)
        ax.axhline(1.05, color="grey", linestyle=":", linewidth=1)
        ax.set_yscale("log")
        plain = FuncFormatter(lambda value, _: f"{value:.2g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.set(xlabel=xlabel, ylabel=f"{label} / {baseline}'s (same draw)")
        ax.grid(alpha=0.3, which="both")
    axes[0][0].legend(fontsize=8)
    return _save(fig, path)


def plot_sweep(points: Sequence[Point], caps: Sequence[SystemCapacity], out: Path,
               capacity_rps: float, runs: Sequence[SweepRun] = (),
               baseline: str = "") -> list[Path]:
    """latency_vs_load.png, engine_vs_load.png, with objectives attainment_vs_load.png, and
    with `runs` of a system beside the `baseline` ratios_vs_load.png, in `out`."""
    xlabel = f"load (x {capacity_rps:.3g} req/s)"
    paths = [_panels(points, _LATENCY, out / "latency_vs_load.png", xlabel),
             _panels(points, _ENGINE, out / "engine_vs_load.png", xlabel, columns=3)]
    if any("attainment" in p.figures for p in points):
        paths.append(_attainment(points, caps, out / "attainment_vs_load.png", xlabel))
    if any(run.system != baseline for run in runs):
        paths.append(_ratios(runs, baseline, out / "ratios_vs_load.png", xlabel))
    return paths
