"""Plots of compare results (matplotlib, Agg: no display on servers)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from bench.report import _Run


def _systems(runs: Sequence[_Run]) -> list[str]:
    return list(dict.fromkeys(r.system for r in runs))


def plot_cdf(runs: Sequence, path: Path, title: str) -> None:
    """JCT CDF per system at one rate (runs must carry .requests)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for run in runs:
        jct = np.sort([q.jct_s for q in run.requests if q.ok])
        ax.plot(jct, np.arange(1, len(jct) + 1) / max(len(jct), 1), label=run.system)
    ax.set(xlabel="JCT (s)", ylabel="fraction of requests", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_sim_vs_real(pairs: Sequence[tuple[str, Sequence[float], Sequence[float]]],
                     path: Path) -> None:
    """One panel per (title, real JCTs, simulated JCTs): the two CDFs over each other."""
    fig, axes = plt.subplots(1, len(pairs), figsize=(3.2 * len(pairs), 3.2), squeeze=False,
                             sharey=True)
    for ax, (title, real, sim) in zip(axes[0], pairs, strict=True):
        for values, style, label in ((real, "-", "real"), (sim, "--", "sim")):
            jct = np.sort(values)
            ax.plot(jct, np.arange(1, len(jct) + 1) / max(len(jct), 1), style, label=label)
        ax.set(xlabel="JCT (s)", title=title)
        ax.title.set_fontsize(9)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("fraction of requests")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_vs_rate(runs: Sequence[_Run], path: Path, metrics: list[tuple[str, str]]) -> None:
    """One panel per (summary field, label), one line per system."""
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4), squeeze=False)
    for ax, (field, label) in zip(axes[0], metrics, strict=True):
        for system in _systems(runs):
            pts = sorted((r.rate, getattr(r.summary, field)) for r in runs if r.system == system)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=system)
        ax.set(xlabel="request rate (req/s)", ylabel=label)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_all(runs: Sequence, out: Path, prefix: str = "") -> list[Path]:
    rates = sorted({r.rate for r in runs})
    paths = []
    for rate in rates:
        path = out / f"{prefix}jct_cdf_rate{rate:g}.png"
        plot_cdf([r for r in runs if r.rate == rate], path, f"JCT CDF at {rate:g} req/s")
        paths.append(path)
    paths.append(out / f"{prefix}jct_vs_rate.png")
    plot_vs_rate(runs, paths[-1], [("mean_jct", "mean JCT (s)"), ("p99_jct", "p99 JCT (s)")])
    paths.append(out / f"{prefix}throughput_vs_rate.png")
    plot_vs_rate(runs, paths[-1], [("throughput_rps", "throughput (req/s)"),
                                   ("throughput_tps", "throughput (output tok/s)")])
    return paths
