"""The figures of `lengthwise bench sweep`, from its runs: per (load, system) the median
with min-max over repetitions, each system's SLO capacity with its spread, and each pair's
engine-speed check. Pure functions of recorded runs (no server, no files)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import msgspec
import numpy as np

from bench.enginespeed import DecodeSpeed, flagged, speed_ratio
from bench.hostload import CpuShare
from bench.metrics import RequestResult, Spread, Summary, meets_slo

ATTAINED = 0.9  # SLO capacity: the highest load with at least this attainment


class SweepRun(msgspec.Struct, kw_only=True):
    """One run's figures (its requests are in its own file, OUT/runs/)."""

    system: str
    load: float  # multiple of the capacity rate
    rate: float  # req/s offered
    repeat: int  # 0-based repetition
    position: int  # where it ran among the systems at this (load, repeat): 0 first
    summary: Summary
    p99_tpot: float | None  # None: no answer of two tokens or more
    # Requests served within every objective / all sent (a refusal is a miss); None
    # without --slo-ttft / --slo-tpot.
    attainment: float | None
    refused: float  # 429s: the client's count or the server's, whichever saw more
    engine_preemptions: float  # the engine's own (vllm:num_preemptions_total)
    policy_preemptions: float  # lengthwise's (lengthwise_preemptions_total)
    speed: DecodeSpeed | None  # the engine's step times (bench/enginespeed.py)
    wall_s: float
    cpu: CpuShare | None = None
    # The engine's own step times, from its step lines in the server's log (--step-log;
    # enginespeed.from_step_lines); None without them.
    engine_speed: DecodeSpeed | None = None
    learned_profile: str = ""  # lengthwise: its clock over the run (bench/compare.py)
    waits: dict[str, float] = {}  # lengthwise's account of its waits (servers.Counters)

    def figure(self, name: str) -> float:
        """A named figure of FIGURES (nan where the run has none)."""
        if name in _OWN:
            value = getattr(self, name)
        elif name == "step_s":
            value = self.speed.step_s if self.speed else None
        elif name == "engine_step_s":
            value = self.engine_speed.step_s if self.engine_speed else None
        elif name == "front_cores":
            value = self.cpu.front_cores if self.cpu else None
        else:
            value = getattr(self.summary, name)
        return math.nan if value is None else float(value)


_OWN = ("p99_tpot", "attainment", "refused", "engine_preemptions", "policy_preemptions")
# What the table and the plots show per (load, system): seconds, shares, counts.
FIGURES = ("mean_ttft", "p99_ttft", "mean_tpot", "p99_tpot", "mean_jct", "p99_jct",
           "attainment", "refused", "engine_preemptions", "policy_preemptions", "step_s",
           "engine_step_s", "front_cores",
           "throughput_rps")


def attainment(results: Sequence[RequestResult], slo_ttft: float | None,
               slo_tpot: float | None) -> float | None:
    """Share of all sent requests served within both objectives; a failed or refused
    request is a miss. None when no objective is set."""
    if slo_ttft is None and slo_tpot is None or not results:
        return None
    met = sum(1 for r in results if r.ok and meets_slo(r, slo_ttft, slo_tpot))
    return met / len(results)


def p99_tpot(results: Sequence[RequestResult]) -> float | None:
    tpots = [r.tpot_s for r in results if r.ok and not math.isnan(r.tpot_s)]
    return float(np.percentile(tpots, 99)) if tpots else None


def spread_of(values: Sequence[float]) -> Spread | None:
    """Median, min and max of the known values; None when none is."""
    clean = [v for v in values if not math.isnan(v)]
    if not clean:
        return None
    return Spread(float(np.median(clean)), min(clean), max(clean))


class Point(msgspec.Struct, kw_only=True):
    """One (load, system) over its repetitions: the FIGURES its runs have, median
    (min-max); a figure no run has (attainment without objectives) is left out."""

    system: str
    load: float
    rate: float  # the offered rate (the same every repetition)
    repeats: int
    figures: dict[str, Spread]


def points(runs: Sequence[SweepRun]) -> list[Point]:
    """By load, then the systems in the order they first ran (the baseline first)."""
    order = {system: k for k, system in enumerate(dict.fromkeys(r.system for r in runs))}
    groups: dict[tuple[float, int], list[SweepRun]] = {}
    for run in runs:
        groups.setdefault((run.load, order[run.system]), []).append(run)
    return [Point(system=group[0].system, load=load, repeats=len(group),
                  rate=group[0].rate, figures=_figures(group))
            for (load, _), group in sorted(groups.items())]


def _figures(runs: Sequence[SweepRun]) -> dict[str, Spread]:
    spreads = {f: spread_of([r.figure(f) for r in runs]) for f in FIGURES}
    return {f: s for f, s in spreads.items() if s is not None}


class Capacity(msgspec.Struct, frozen=True):
    load: float
    # "": interpolated where attainment crosses ATTAINED; ">=": attained at every load
    # measured (the highest is a lower bound); "<": missed already at the lowest load.
    bound: str = ""

    def describe(self) -> str:
        return f"{self.bound}{self.load:.2f}x"


def slo_capacity(curve: Sequence[tuple[float, float]], threshold: float = ATTAINED
                 ) -> Capacity:
    """The highest load at which the piecewise-linear attainment curve through (load,
    attainment) is still >= threshold: past the last load that attains it, where the line
    to the next load crosses it."""
    ordered = sorted(curve)
    met = [k for k, (_, att) in enumerate(ordered) if att >= threshold]
    if not met:
        return Capacity(ordered[0][0], "<")
    k = met[-1]
    if k == len(ordered) - 1:
        return Capacity(ordered[k][0], ">=")
    (x0, y0), (x1, y1) = ordered[k], ordered[k + 1]
    return Capacity(x0 + (y0 - threshold) / (y0 - y1) * (x1 - x0))


class SystemCapacity(msgspec.Struct, kw_only=True):
    system: str
    spread: Spread  # over repetitions, in load units
    per_repeat: list[Capacity]


def capacities(runs: Sequence[SweepRun]) -> list[SystemCapacity]:
    """Each system's SLO capacity, one per repetition (its own attainment curve), and
    their median (min-max). Empty without objectives."""
    curves: dict[str, dict[int, list[tuple[float, float]]]] = {}
    for run in runs:
        if run.attainment is not None:
            curves.setdefault(run.system, {}).setdefault(run.repeat, []).append(
                (run.load, run.attainment))
    out = []
    for system, by_repeat in curves.items():
        caps = [slo_capacity(curve) for _, curve in sorted(by_repeat.items())]
        loads = [c.load for c in caps]
        out.append(SystemCapacity(system=system, per_repeat=caps, spread=Spread(
            float(np.median(loads)), min(loads), max(loads))))
    return out


class Pair(msgspec.Struct, kw_only=True):
    """A system's run beside the baseline's at the same (load, repetition)."""

    load: float
    repeat: int
    system: str
    step_ratio: float | None  # its engine step time / the baseline's (enginespeed)
    matched: bool  # compared at matched batch sizes (else the runs' overall step times)
    flagged: bool  # engine speeds differ by more than 10 %


def paired(runs: Sequence[SweepRun], baseline: str) -> Iterator[tuple[SweepRun, SweepRun]]:
    """Each other system's run with the baseline's at the same (load, repetition)."""
    base = {(r.load, r.repeat): r for r in runs if r.system == baseline}
    for run in runs:
        ref = base.get((run.load, run.repeat))
        if run.system != baseline and ref is not None:
            yield run, ref


def figure_ratio(run: SweepRun, ref: SweepRun, figure: str) -> float:
    """The run's figure (SweepRun.figure) over the baseline run's; nan unless both are
    positive (nothing completed, or no attainment measured: nan)."""
    mine, theirs = run.figure(figure), ref.figure(figure)
    return mine / theirs if mine > 0 and theirs > 0 else math.nan


def _speeds(run: SweepRun, ref: SweepRun) -> tuple[DecodeSpeed, DecodeSpeed] | None:
    """(the baseline run's, the run's) step times to compare: the engines' own where both
    logged their steps (--step-log), else the client's; None where either has none."""
    if run.engine_speed and ref.engine_speed:
        return ref.engine_speed, run.engine_speed
    return (ref.speed, run.speed) if ref.speed and run.speed else None


def step_ratio(run: SweepRun, ref: SweepRun) -> float:
    """The run's engine step time over the baseline run's (enginespeed.speed_ratio, on
    _speeds); nan where either has no step times."""
    speeds = _speeds(run, ref)
    return speed_ratio(*speeds)[0] if speeds else math.nan


def pairs(runs: Sequence[SweepRun], baseline: str) -> list[Pair]:
    out = []
    for run, ref in paired(runs, baseline):
        speeds = _speeds(run, ref)
        ratio, matched = speed_ratio(*speeds) if speeds else (None, False)
        out.append(Pair(load=run.load, repeat=run.repeat, system=run.system,
                        step_ratio=ratio, matched=matched,
                        flagged=ratio is not None and flagged(ratio)))
    return sorted(out, key=lambda p: (p.load, p.repeat, p.system))


# Load bands of at_equal_speed: (name, lowest load, below this load)
BANDS = (("below 0.8x", 0.0, 0.8), ("0.8-1.2x", 0.8, 1.2), ("1.2x and above", 1.2, math.inf))
RATIO_FIGURES = ("mean_ttft", "p99_ttft", "mean_tpot", "mean_jct", "p99_jct")
PAIRED_FIGURES = (*RATIO_FIGURES, "attainment")  # paired_loads: attainment where measured


class Adjusted(msgspec.Struct, kw_only=True):
    """One figure of a system against the baseline over the pairs of one load band: the
    geometric mean of the paired ratios, and the ratio at equal engine speed (the intercept
    of log ratio on log step ratio, with +-2 standard errors)."""

    system: str
    band: str
    figure: str
    n: int  # pairs
    ratio: float
    at_equal_speed: float
    low: float
    high: float


def at_equal_speed(runs: Sequence[SweepRun], baseline: str,
                   min_pairs: int = 4) -> list[Adjusted]:
    """Near saturation a few per cent of engine speed moves the queue more than any
    policy, and the engine's speed drifts between runs (10-30 % on a shared machine): a
    pair's ratio is mostly the machine. Fitting each figure's log ratio on the log of the
    pair's step-time ratio (enginespeed.speed_ratio, at matched batch sizes) over a band of
    loads reads off what the scheduler does at equal engine speed. Bands with fewer than
    `min_pairs` timed pairs are left out."""
    groups: dict[tuple[str, str], list[tuple[SweepRun, SweepRun]]] = {}
    for run, ref in paired(runs, baseline):
        band = next(name for name, low, high in BANDS if low <= run.load < high)
        if step_ratio(run, ref) > 0:  # not nan: both timed
            groups.setdefault((run.system, band), []).append((run, ref))
    out = []
    for (system, band), rows in groups.items():
        for figure in RATIO_FIGURES:
            points = [(math.log(step_ratio(run, ref)), math.log(ratio)) for run, ref in rows
                      if (ratio := figure_ratio(run, ref, figure)) > 0]
            if len(points) < min_pairs:
                continue
            x, y = np.array(points).T
            design = np.vstack([np.ones_like(x), x]).T
            coef = np.linalg.lstsq(design, y, rcond=None)[0]
            residual = y - design @ coef
            variance = residual @ residual / (len(y) - 2)
            se = math.sqrt(variance * np.linalg.pinv(design.T @ design)[0, 0])
            out.append(Adjusted(system=system, band=band, figure=figure, n=len(points),
                                ratio=math.exp(float(y.mean())),
                                at_equal_speed=math.exp(float(coef[0])),
                                low=math.exp(float(coef[0]) - 2 * se),
                                high=math.exp(float(coef[0]) + 2 * se)))
    order = {name: i for i, (name, _, _) in enumerate(BANDS)}
    return sorted(out, key=lambda a: (a.system, order[a.band], RATIO_FIGURES.index(a.figure)))


class PairedLoad(msgspec.Struct, kw_only=True):
    """A system against the baseline at one load, pair by pair (the same draw of the
    workload, run one after the other): each figure's paired ratio as its geometric mean
    over the repetitions (min-max), and the geometric mean over the pairs whose engine
    speeds matched (not flagged; nan where none did)."""

    system: str
    load: float
    n: int  # pairs
    flagged: int  # of them, engine speeds more than 10 % apart
    # figure -> the paired ratios' geometric mean (in Spread's `median` field) and min-max
    ratios: dict[str, Spread]
    unflagged: dict[str, float]  # figure -> geometric mean over the unflagged pairs


def paired_loads(runs: Sequence[SweepRun], baseline: str) -> list[PairedLoad]:
    """Ratios of medians mix draws (a system's median and the baseline's may come from
    different repetitions); a pair shares its draw, so its ratio is the scheduler's and the
    machine's of that moment only."""
    flagged_pairs = {(p.load, p.repeat, p.system) for p in pairs(runs, baseline) if p.flagged}
    groups: dict[tuple[str, float], list[tuple[SweepRun, SweepRun]]] = {}
    for run, ref in paired(runs, baseline):
        groups.setdefault((run.system, run.load), []).append((run, ref))
    out = []
    for (system, load), rows in sorted(groups.items(), key=lambda item: item[0][::-1]):
        flags = [(run.load, run.repeat, run.system) in flagged_pairs for run, _ in rows]
        spreads, unflagged = {}, {}
        for figure in PAIRED_FIGURES:
            ratios = [figure_ratio(run, ref, figure) for run, ref in rows]
            kept = [r for r in ratios if r > 0]
            if not kept:
                continue
            spreads[figure] = Spread(geomean(kept), min(kept), max(kept))
            steady = [r for r, flag in zip(ratios, flags, strict=True) if r > 0 and not flag]
            unflagged[figure] = geomean(steady) if steady else math.nan
        out.append(PairedLoad(system=system, load=load, n=len(rows), flagged=sum(flags),
                              ratios=spreads, unflagged=unflagged))
    return out


def geomean(values: Sequence[float]) -> float:
    """The geometric mean of positive ratios (paired ratios average in logs)."""
    return math.exp(sum(math.log(v) for v in values) / len(values))
