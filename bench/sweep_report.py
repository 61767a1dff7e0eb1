"""The markdown `lengthwise bench sweep` prints and writes (OUT/summary.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from bench import sweepstats as stats
from bench.metrics import Spread

# (figure, column header, scale, digits)
_COLUMNS = (("mean_ttft", "mean TTFT (ms)", 1000, 0), ("p99_ttft", "p99 TTFT (ms)", 1000, 0),
            ("mean_tpot", "mean TPOT (ms)", 1000, 2), ("p99_tpot", "p99 TPOT (ms)", 1000, 2),
            ("mean_jct", "mean JCT (s)", 1, 2), ("p99_jct", "p99 JCT (s)", 1, 2),
            ("attainment", "attainment (%)", 100, 1), ("refused", "refused", 1, 0),
            ("engine_preemptions", "engine preemptions", 1, 0),
            ("policy_preemptions", "lengthwise preemptions", 1, 0),
            ("step_s", "client's step (ms)", 1000, 2),
            ("engine_step_s", "engine's step (ms)", 1000, 2),
            ("front_cores", "front CPU (cores)", 1, 2))
_RATIOS = ("mean_ttft", "p99_ttft", "mean_tpot", "mean_jct", "p99_jct", "attainment")


def _num(value: float, digits: int) -> str:
    return "–" if math.isnan(value) else f"{value:.{digits}f}"


def cell(spread: Spread | None, scale: float = 1.0, digits: int = 2) -> str:
    """median (min–max); the median alone where they are one value; – for none."""
    if spread is None:
        return "–"
    median = _num(spread.median * scale, digits)
    if spread.min == spread.max:
        return median
    return f"{median} ({_num(spread.min * scale, digits)}–{_num(spread.max * scale, digits)})"


def points_table(points: Sequence[stats.Point]) -> str:
    """Per load and system, every figure as median (min–max) over repetitions."""
    head = "| load | system | req/s | " + " | ".join(c[1] for c in _COLUMNS) + " |"
    lines = [head, "|---" * (len(_COLUMNS) + 3) + "|"]
    for p in points:
        cells = " | ".join(cell(p.figures.get(f), scale, digits)
                           for f, _, scale, digits in _COLUMNS)
        lines.append(f"| {p.load:g}x | {p.system} | {p.rate:.3g} | {cells} |")
    return "\n".join(lines) + "\n"


def ratio_table(points: Sequence[stats.Point], baseline: str) -> str:
    """Each system's medians over the baseline's at the same load."""
    base = {p.load: p for p in points if p.system == baseline}
    names = {f: name.split(" (")[0] for f, name, _, _ in _COLUMNS}
    lines = ["| load | system | " + " | ".join(f"{names[f]} vs {baseline}"
                                               for f in _RATIOS) + " |",
             "|---" * (len(_RATIOS) + 2) + "|"]
    for p in points:
        ref = base.get(p.load)
        if p.system == baseline or ref is None:
            continue
        ratios = [p.figures[f].median / ref.figures[f].median
                  if f in p.figures and f in ref.figures and ref.figures[f].median
                  else math.nan for f in _RATIOS]
        lines.append(f"| {p.load:g}x | {p.system} | "
                     + " | ".join(_num(r, 2) + "x" if not math.isnan(r) else "–"
                                  for r in ratios) + " |")
    return "\n".join(lines) + "\n"


def capacity_table(caps: Sequence[stats.SystemCapacity], baseline: str, capacity_rps: float) -> str:
    """SLO capacity (the highest load with >= 90 % attainment, interpolated) per system:
    median (min–max) over repetitions, in load units and req/s, and over the baseline's;
    ">=" where every repetition met it at every load, "<" where none did at the lowest."""
    base = next((c for c in caps if c.system == baseline), None)
    lines = ["| system | SLO capacity (x load) | req/s | vs " + baseline + " | per repetition |",
             "|---" * 5 + "|"]
    for c in caps:
        bound = _bound(c)
        lines.append(f"| {c.system} | {bound}{cell(c.spread)} "
                     f"| {bound}{c.spread.median * capacity_rps:.3g} "
                     f"| {_relative(c, base)} "
                     f"| {', '.join(k.describe() for k in c.per_repeat)} |")
    return "\n".join(lines) + "\n"


def _bound(cap: stats.SystemCapacity) -> str:
    """">=" or "<" where every repetition's capacity is censored alike; else ""."""
    bounds = {k.bound for k in cap.per_repeat}
    return bounds.pop() if len(bounds) == 1 else ""


def _relative(cap: stats.SystemCapacity, base: stats.SystemCapacity | None) -> str:
    """cap / base, as a bound where cap is one, "–" where base is one (or missing)."""
    if base is None or _bound(base) or not base.spread.median:
        return "–"
    return f"{_bound(cap)}{cap.spread.median / base.spread.median:.2f}x"


def pairs_table(pairs: Sequence[stats.Pair], baseline: str) -> str:
    """Each system's engine step time over the baseline's in the same (load, repetition);
    `!` where they differ by more than 10 %, `~` where no batch size was shared."""
    rows: dict[tuple[float, str], list[stats.Pair]] = {}
    for pair in pairs:
        rows.setdefault((pair.load, pair.system), []).append(pair)
    lines = [f"| load | system | step time vs {baseline}, per repetition | flagged |",
             "|---" * 4 + "|"]
    for (load, system), group in sorted(rows.items()):
        ratios = ", ".join("–" if p.step_ratio is None else
                           f"{p.step_ratio:.2f}x{'' if p.matched else '~'}"
                           f"{'!' if p.flagged else ''}" for p in group)
        lines.append(f"| {load:g}x | {system} | {ratios} | {sum(p.flagged for p in group)} |")
    return "\n".join(lines) + "\n"


def paired_table(rows: Sequence[stats.PairedLoad], baseline: str) -> str:
    """Per load and system: each figure's paired ratio to the baseline, geometric mean
    (min-max) over the repetitions, and over the unflagged pairs only."""
    names = {f: name.split(" (")[0] for f, name, _, _ in _COLUMNS}
    lines = ["| load | system | pairs (flagged) | "
             + " | ".join(f"{names[f]} vs {baseline}" for f in stats.PAIRED_FIGURES) + " |",
             "|---" * (len(stats.PAIRED_FIGURES) + 3) + "|"]
    for row in rows:
        cells = []
        for figure in stats.PAIRED_FIGURES:
            spread = row.ratios.get(figure)
            steady = row.unflagged.get(figure, math.nan)
            text = "–" if spread is None else _ratio_cell(spread)
            if row.flagged and not math.isnan(steady):
                text += f"; unflagged {steady:.2f}x"
            cells.append(text)
        lines.append(f"| {row.load:g}x | {row.system} | {row.n} ({row.flagged}) | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _ratio_cell(spread: Spread) -> str:
    """A paired ratio: its geometric mean (Spread.median), with min–max where they differ."""
    text = f"{spread.median:.2f}x"
    return text if spread.min == spread.max else f"{text} ({spread.min:.2f}–{spread.max:.2f})"


def adjusted_table(rows: Sequence[stats.Adjusted], baseline: str) -> str:
    """Per system and load band: each figure's paired ratio to the baseline (geometric
    mean) and at equal engine speed, with its +-2 standard errors."""
    lines = [f"| system | loads | figure | pairs | ratio vs {baseline} | at equal engine speed |",
             "|---" * 6 + "|"]
    for a in rows:
        lines.append(f"| {a.system} | {a.band} | {a.figure} | {a.n} | {a.ratio:.2f}x | "
                     f"{a.at_equal_speed:.2f}x ({a.low:.2f}-{a.high:.2f}) |")
    return "\n".join(lines) + "\n"


def refusals_table(runs: Sequence[stats.SweepRun]) -> str:
    """Per load and lengthwise system: the requests it refused (429) and, in shadow mode
    ([slo] enforce = false), those it would have refused and whether they then met their
    objective (lengthwise_slo_shadow_refusals_total). A would-be refusal was right when the
    request, served anyway, missed: precision = missed / would-refuse. The last column
    splits them by the forecast that refused (job.Refusal.cause), the shadow ones' met in
    brackets; the one before it is the precision of the would-be refusals predicted over
    OVER x their objective (lengthwise_slo_shadow_overshoot): of refusing only those. Sums
    over the repetitions; "" where no run refused or would have."""
    rows: dict[tuple[float, str], list[float]] = {}
    causes: dict[tuple[float, str], dict[str, list[float]]] = {}
    for run in runs:
        met, missed = run.waits.get("shadow:met", 0.0), run.waits.get("shadow:missed", 0.0)
        if run.waits or run.refused:
            row = rows.setdefault((run.load, run.system), [0.0, 0.0, 0.0, 0.0])
            for i, value in enumerate((run.refused, met, missed, 1.0)):
                row[i] += value
        for key, value in run.waits.items():
            kind, _, label = key.partition(":")
            if kind in ("refused_by", "shadow_by") and value:
                cause, _, outcome = label.partition("/")
                count = causes.setdefault((run.load, run.system), {}).setdefault(
                    cause, [0.0, 0.0])
                count[0] += value
                count[1] += value if outcome == "met" else 0.0
    if not any(refused or met or missed for refused, met, missed, _ in rows.values()):
        return ""
    head = ("| load | system | runs | refused | would refuse (shadow) | of them met | "
            f"of them missed | precision | over {OVER:g}x: precision (of) | by cause |")
    lines = [head, "|---" * 10 + "|"]
    for (load, system), (refused, met, missed, n) in sorted(rows.items()):
        shadow = met + missed
        precision = f"{100 * missed / shadow:.0f} %" if shadow else "–"
        over = _over(runs, load, system)
        by_cause = ", ".join(
            f"{cause} {count:g}" + (f" ({cause_met:g} met)" if shadow else "")
            for cause, (count, cause_met) in sorted(causes.get((load, system), {}).items()))
        lines.append(f"| {load:g}x | {system} | {n:g} | {refused:g} | {shadow:g} | {met:g} "
                     f"| {missed:g} | {precision} | {over} | {by_cause or '–'} |")
    return "\n".join(lines) + "\n"


OVER = 1.25  # the overshoot bound the refusals table reads (a bucket of the daemon's)


def _over(runs: Sequence[stats.SweepRun], load: float, system: str) -> str:
    """"93 % (120)": of the would-be refusals predicted over OVER x their objective, the
    share that missed, and how many; "–" where the runs counted none."""
    counts = {"met": 0.0, "missed": 0.0}
    for run in runs:
        if run.load != load or run.system != system:
            continue
        for outcome in counts:
            counts[outcome] += (run.waits.get(f"overshoot:{outcome}/+Inf", 0.0)
                                - run.waits.get(f"overshoot:{outcome}/{OVER}", 0.0))
    over = counts["met"] + counts["missed"]
    return f"{100 * counts['missed'] / over:.0f} % ({over:g})" if over else "–"
