"""One system against the baseline over the pairs of several sweeps: two or three pairs of
one sweep decide nothing on a machine whose speed moves by the hour (single pairs of the
same code ran 0.61-1.43x), the pool of every sweep of the same code does.

    python -m bench.pooled --system lengthwise:ssjf OUT1 OUT2 OUT3@lengthwise:ssjf+x=y ...

Each OUT is a `bench sweep` --out folder (its sweep.json); `OUT@SYSTEM` takes that sweep's
SYSTEM instead of --system (the same code under another name, e.g. a knob set to its
default). Per load: each figure's paired ratio to the baseline, geometric mean over the
pairs (min-max; in how many pairs the system was worse), the pairs whose engine speeds
differ by more than 10 % counted in, the engine step ratio's geometric mean, and whether the
pooled ratios meet issue 39's do-no-harm target (NO_HARM); then each figure's plain mean
over the same runs, system / baseline, in its own units (the sizes behind the ratios: in
the geometric mean a pair at 60 against 40 ms weighs as much as one at 3.0 against 2.0 s),
with the system's event-loop stalls (its loop watch's probes late by more than a second);
then each figure per load band at equal engine speed (bench sweep's own fit, over all the
pairs)."""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

from bench import sweepstats as stats
from bench.sweep import load_results
from bench.sweep_report import adjusted_table
from bench.sweepstats import SweepRun

_NAMES = {"mean_ttft": "mean TTFT", "p99_ttft": "p99 TTFT", "mean_tpot": "mean TPOT",
          "mean_jct": "mean JCT", "p99_jct": "p99 JCT", "attainment": "attainment"}
# Issue 39's do-no-harm target, on each figure's pooled ratio to the baseline: latencies at
# most these (means 1.0x, tails 1.05x), and, where the requests carried their objectives
# (--send-slo), attainment at least the baseline's.
NO_HARM = {"mean_ttft": 1.0, "p99_ttft": 1.05, "mean_tpot": 1.0, "mean_jct": 1.0,
           "p99_jct": 1.05}


def parse_source(text: str, system: str) -> tuple[Path, str]:
    """`OUT` or `OUT@SYSTEM`: the folder and the system to take from it."""
    out, _, named = text.partition("@")
    return Path(out), named or system


def pooled_runs(sources: Sequence[tuple[Path, str]], baseline: str,
                label: str) -> list[SweepRun]:
    """The baseline's runs and each source's system's (renamed `label`), their repetitions
    renumbered so that no two sweeps' pairs meet."""
    runs: list[SweepRun] = []
    offset = 0
    for out, system in sources:
        results = load_results(out / "sweep.json")
        if system not in results.systems or baseline not in results.systems:
            raise SystemExit(f"{out}: has {', '.join(results.systems)}; "
                             f"not {system!r} and {baseline!r}")
        for run in results.runs:
            if run.system in (baseline, system):
                runs.append(msgspec.structs.replace(
                    run, repeat=run.repeat + offset,
                    system=baseline if run.system == baseline else label))
        offset += results.repeats
    return runs


def table(runs: Sequence[SweepRun], baseline: str, unflagged: bool = False,
          objectives_sent: bool = False) -> str:
    """Per load: pairs (flagged), each figure's geometric mean (min-max; pairs worse), the
    engine step's geometric mean, the do-no-harm verdict (attainment judged in it only with
    `objectives_sent`); with `unflagged`, over the pairs whose engine speeds were within
    10 % only."""
    # flagged as the sweep's own pair-by-pair table flags them (stats.pairs): a pair with
    # no step times is not flagged
    flags = {(p.load, p.repeat, p.system): p for p in stats.pairs(runs, baseline)}
    by_load = _by_load(runs, baseline, lambda run: not (
        unflagged and flags[(run.load, run.repeat, run.system)].flagged))
    lines = ["| load | pairs (flagged) | " + " | ".join(_NAMES.values())
             + " | engine step | do no harm |", "|---" * (len(_NAMES) + 4) + "|"]
    for load, rows in sorted(by_load.items()):
        pairs = [flags[(run.load, run.repeat, run.system)] for run, _ in rows]
        steps = [p.step_ratio for p in pairs if p.step_ratio]
        flagged = sum(p.flagged for p in pairs)
        cells, pooled = [], {}
        for figure in _NAMES:
            ratios = [r for run, ref in rows if (r := stats.figure_ratio(run, ref, figure)) > 0]
            # "worse": a longer latency, a lower attainment
            worse = sum(r < 1 if figure == "attainment" else r > 1 for r in ratios)
            if ratios:
                pooled[figure] = stats.geomean(ratios)
            cells.append("–" if not ratios else
                         f"{pooled[figure]:.2f}x ({min(ratios):.2f}-{max(ratios):.2f}; "
                         f"{worse})")
        step = f"{stats.geomean(steps):.2f}x" if steps else "–"
        lines.append(f"| {load:g}x | {len(rows)} ({flagged}) | " + " | ".join(cells)
                     + f" | {step} | {no_harm(pooled, objectives_sent)} |")
    return "\n".join(lines) + "\n"


def sizes_table(runs: Sequence[SweepRun], baseline: str) -> str:
    """Per load: each figure's arithmetic mean over the paired runs, the system's / the
    baseline's (TTFT in ms, JCT in s, attainment in %), and the system's event-loop stalls
    (probes late by more than a second, summed over its runs: `lag` in servers.Counters)."""
    by_load = _by_load(runs, baseline, lambda run: True)
    units = {"mean_ttft": ("ms", 1e3, 0), "p99_ttft": ("ms", 1e3, 0),
             "mean_tpot": ("ms", 1e3, 2), "mean_jct": ("s", 1.0, 2), "p99_jct": ("s", 1.0, 2),
             "attainment": ("%", 100.0, 1)}
    lines = ["| load | pairs | " + " | ".join(f"{_NAMES[f]} ({unit})"
                                               for f, (unit, _, _) in units.items())
             + " | loop stalls > 1 s |", "|---" * (len(units) + 3) + "|"]
    for load, rows in sorted(by_load.items()):
        cells = []
        for figure, (_, scale, digits) in units.items():
            mine = [run.figure(figure) for run, _ in rows]
            theirs = [ref.figure(figure) for _, ref in rows]
            if any(math.isnan(v) for v in mine + theirs):
                cells.append("–")
                continue
            cells.append(f"{scale * statistics.fmean(mine):.{digits}f} / "
                         f"{scale * statistics.fmean(theirs):.{digits}f}")
        stalls = sum(run.waits.get("lag:+Inf", 0.0) - run.waits.get("lag:1.0", 0.0)
                     for run, _ in rows if "lag:1.0" in run.waits)
        counted = sum("lag:1.0" in run.waits for run, _ in rows)
        cells.append(f"{stalls:g} in {counted} runs" if counted else "–")
        lines.append(f"| {load:g}x | {len(rows)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _by_load(runs: Sequence[SweepRun], baseline: str, keep: Callable[[SweepRun], bool]
             ) -> dict[float, list[tuple[SweepRun, SweepRun]]]:
    """The (run, baseline's run) pairs kept, by load."""
    by_load: dict[float, list[tuple[SweepRun, SweepRun]]] = {}
    for run, ref in stats.paired(runs, baseline):
        if keep(run):
            by_load.setdefault(run.load, []).append((run, ref))
    return by_load


def no_harm(pooled: dict[str, float], objectives_sent: bool) -> str:
    """The do-no-harm verdict (NO_HARM) on one load's pooled ratios: "yes", or the figures
    past their limit. Ratios shown to two places are judged as shown (1.004x is 1.00x).
    Attainment counts only where the requests carried their objectives: best effort, a
    server is not asked to meet them."""
    missed = [f"{_NAMES[name]} {pooled[name]:.2f}x" for name, limit in NO_HARM.items()
              if name in pooled and round(pooled[name], 2) > limit]
    if objectives_sent and "attainment" in pooled and round(pooled["attainment"], 2) < 1.0:
        missed.append(f"attainment {pooled['attainment']:.2f}x")
    return "no: " + ", ".join(missed) if missed else "yes"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pooled", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outs", nargs="+", metavar="OUT[@SYSTEM]")
    parser.add_argument("--system", required=True, help="the system to take from each OUT")
    parser.add_argument("--baseline", default="vllm")
    parser.add_argument("--unflagged", action="store_true",
                        help="leave out the pairs whose engine speeds differ by more than 10 %%")
    args = parser.parse_args(argv)
    sources = [parse_source(text, args.system) for text in args.outs]
    runs = pooled_runs(sources, args.baseline, args.system)
    pairs = sum(1 for _ in stats.paired(runs, args.baseline))
    if not pairs:
        raise SystemExit("no pairs: the sweeps ran no load and repetition of both systems")
    print(f"{args.system} against {args.baseline}, {pairs} pairs from {len(sources)} "
          f"sweeps: paired ratios, geometric mean (min-max; pairs worse)\n")
    sent = all(results.slo is not None and system not in results.slo_exempt
               for results, system in ((load_results(out / "sweep.json"), system)
                                       for out, system in sources))
    print(table(runs, args.baseline, args.unflagged, objectives_sent=sent))
    print(f"Plain means over the same runs, {args.system} / {args.baseline}:\n")
    print(sizes_table(runs, args.baseline))
    print("At equal engine speed (log ratio fitted on log step ratio, per load band, "
          "+-2 standard errors):\n")
    print(adjusted_table(stats.at_equal_speed(runs, args.baseline), args.baseline))


if __name__ == "__main__":
    main()
