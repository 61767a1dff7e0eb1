"""Were lengthwise's refusals right? Each request a lengthwise system refused (429) in a
`lengthwise bench sweep`, judged by what the baseline (the sweep's first system, vLLM's
server) did with the same request of the same draw: served within the objectives there, the
refusal was wrong (a request lengthwise could have served in time, had it been no busier).

    python -m bench.refusals OUT...

With the core's trace (`bench sweep --trace`: a line per refusal on a forecast, the HTTP
layer's early probe included), the refusals are split by how far over the objective the
forecast put them (the overshoot, what `[slo] refuse_overshoot` bounds): how many a higher
bound would have accepted, and how many of those the baseline served in time; and the near
ones (within NEAR x the objective) by the late jobs the overload gate had counted when it
refused them (traces from 2026-12-01's 24th session on): whether a gate asking for more late
jobs would have kept the wrong ones; and every refusal by the inflow (arrivals / ends over
30 s) the gate read when it refused (traces from 2026-12-02 on): what `[slo] refuse_inflow`
at each band's floor would have kept; and by the learned margin the forecast was multiplied
by (real / forecast wait of recent promised starts). Trace lines and refusals are matched in order within a
server's life (a server per system and repetition, the loads in turn); a server whose counts
differ is left out of that split.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import msgspec

from bench import sweep
from bench.metrics import RequestResult, is_refused, meets_slo
from bench.servers import parse_system

BOUNDS = (1.1, 1.25, 1.5, 2.0)  # overshoot bands: <= 1.1, 1.1-1.25, ... > 2.0
NEAR = 1.25  # the near misses, split by late jobs
LATE = (0, 1, 3)  # late-job bands: 0, 1, 2-3, 4+
INFLOW = (1.1, 1.25, 1.5)  # inflow bands: < 1.1, 1.1-1.25, 1.25-1.5, 1.5+
MARGIN = (1.0, 1.5, 2.0, 3.0)  # margin bands: < 1, 1-1.5, 1.5-2, 2-3, 3+


def _counts(bands: int) -> list[list[int]]:
    """A Tally field: [refused, wrong] per band, fresh for each Tally."""
    return msgspec.field(default_factory=lambda: [[0, 0] for _ in range(bands)])


class Tally(msgspec.Struct):
    """Refusals at one (load, system) over its repetitions, and how many the baseline
    served in time; by overshoot band where the trace says."""

    refused: int = 0
    wrong: int = 0
    bands: list[list[int]] = _counts(len(BOUNDS) + 1)
    # the near misses by late jobs at the refusal (LATE bands; traces that hold the count)
    near: list[list[int]] = _counts(len(LATE) + 1)
    # every refusal by the inflow at the refusal (INFLOW bands; traces that hold it)
    inflow: list[list[int]] = _counts(len(INFLOW) + 1)
    # every refusal on a forecast by the margin it was multiplied by (MARGIN bands)
    margin: list[list[int]] = _counts(len(MARGIN) + 1)
    unmatched: int = 0  # refusals of servers whose trace did not match (no band)

    def add(self, other: Tally) -> None:
        self.refused += other.refused
        self.wrong += other.wrong
        self.unmatched += other.unmatched
        for mine, theirs in zip(self.bands + self.near + self.inflow + self.margin,
                                other.bands + other.near + other.inflow + other.margin,
                                strict=True):
            mine[0] += theirs[0]
            mine[1] += theirs[1]


def band(overshoot: float) -> int:
    return bisect.bisect_left(BOUNDS, overshoot)


class Shot(NamedTuple):
    """A refusal on a forecast, as the trace holds it (None: traces before that field)."""

    overshoot: float
    late: int | None  # the late jobs the overload gate counted
    inflow: float | None  # arrivals / ends the gate read
    margin: float | None  # the learned margin the forecast wait was multiplied by


def overshoots(path: Path) -> list[Shot]:
    """Each refusal on a forecast that a trace holds, in order."""
    if not path.is_file():
        return []
    found = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get("ev") == "refuse" and record.get("overshoot") is not None:
            found.append(Shot(float(record["overshoot"]), record.get("late"),
                              record.get("inflow"), record.get("margin")))
    return found


def _requests(out: Path, label: str, load: float, repeat: int) -> list[RequestResult] | None:
    path = sweep.run_file(out, label, load, repeat)
    if not path.is_file():
        return None
    return msgspec.json.decode(path.read_bytes(), type=sweep.RunFile).requests


def tally(out: Path) -> dict[tuple[float, str], Tally]:
    """Per (load, lengthwise system) of the sweep at `out`, against its first system."""
    results = sweep.load_results(out / "sweep.json")
    baseline = parse_system(results.systems[0]).label
    tallies: dict[tuple[float, str], Tally] = {}
    for spec in results.systems[1:]:
        system = parse_system(spec)
        if system.kind != "lengthwise":
            continue
        for repeat in range(results.repeats):
            suffix = f"-{repeat}" if repeat else ""
            shots = overshoots(out / f"{system.label}{suffix}.trace.jsonl")
            judged: list[tuple[float, bool]] = []  # (load, the baseline met it), in order
            for load in results.loads:
                mine = _requests(out, system.label, load, repeat)
                theirs = _requests(out, baseline, load, repeat)
                if mine is None or theirs is None:
                    continue
                met = {r.index: r.ok and meets_slo(r, results.slo_ttft, results.slo_tpot)
                       for r in theirs}
                turned = sorted((r for r in mine if not r.ok and is_refused(r.error)),
                                key=lambda r: r.arrival_s)
                judged += [(load, met.get(r.index, False)) for r in turned]
            matched = len(shots) == len(judged)
            for k, (load, wrong) in enumerate(judged):
                t = tallies.setdefault((load, spec), Tally())
                t.refused += 1
                t.wrong += wrong
                if not matched:
                    t.unmatched += 1
                    continue
                shot = shots[k]
                counts = [t.bands[band(shot.overshoot)]]
                if shot.overshoot <= NEAR and shot.late is not None:
                    counts.append(t.near[bisect.bisect_left(LATE, shot.late)])
                if shot.inflow is not None:
                    counts.append(t.inflow[bisect.bisect_right(INFLOW, shot.inflow)])
                if shot.margin is not None:
                    counts.append(t.margin[bisect.bisect_right(MARGIN, shot.margin)])
                for count in counts:
                    count[0] += 1
                    count[1] += wrong
    return tallies


def table(tallies: dict[tuple[float, str], Tally], baseline: str) -> str:
    names = [f"<= {BOUNDS[0]:g}x"] + [f"{lo:g}-{hi:g}x" for lo, hi in itertools.pairwise(BOUNDS)]
    names.append(f"> {BOUNDS[-1]:g}x")
    head = (f"| load | system | refused | {baseline} met in time | right | "
            + " | ".join(f"over {name}: wrong / refused" for name in names) + " |")
    lines = [head, "|---" * (5 + len(names)) + "|"]
    for (load, system), t in sorted(tallies.items()):
        right = f"{100 * (t.refused - t.wrong) / t.refused:.0f} %" if t.refused else "–"
        cells = _cells(t.bands)
        if t.unmatched:
            cells[-1] += f" ({t.unmatched} untraced)"
        lines.append(f"| {load:g}x | {system} | {t.refused} | {t.wrong} | {right} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def split_table(tallies: dict[tuple[float, str], Tally], split: str) -> str:
    """Wrong / refused by the trace's `split` ("near": the refusals within NEAR x by late
    jobs; "inflow", "margin": all of them by inflow, by margin); "" where no trace held
    it."""
    names = {"near": ["0 late", "1 late", "2-3 late", "4+ late"],
             "inflow": _names("inflow", INFLOW), "margin": _names("margin", MARGIN)}[split]
    if not any(n for t in tallies.values() for n, _ in getattr(t, split)):
        return ""
    lines = ["| load | system | " + " | ".join(f"{name}: wrong / refused" for name in names)
             + " |", "|---" * (2 + len(names)) + "|"]
    for (load, system), t in sorted(tallies.items()):
        lines.append(f"| {load:g}x | {system} | " + " | ".join(_cells(getattr(t, split)))
                     + " |")
    return "\n".join(lines) + "\n"


def _names(what: str, bounds: tuple[float, ...]) -> list[str]:
    return ([f"{what} < {bounds[0]:g}"] + [f"{lo:g}-{hi:g}" for lo, hi in
                                           itertools.pairwise(bounds)]
            + [f">= {bounds[-1]:g}"])


def _cells(counts: list[list[int]]) -> list[str]:
    """"wrong / refused" per band, "–" where none was refused."""
    return [f"{wrong} / {n}" if n else "–" for n, wrong in counts]


def merged(outs: Iterable[Path]) -> tuple[dict[tuple[float, str], Tally], str]:
    """The tallies of several sweeps summed (the same systems and loads: more draws)."""
    total: dict[tuple[float, str], Tally] = {}
    baseline = ""
    for out in outs:
        baseline = baseline or sweep.load_results(out / "sweep.json").systems[0]
        for key, t in tally(out).items():
            total.setdefault(key, Tally()).add(t)
    return total, baseline


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.refusals", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="+", type=Path, help="a bench sweep's --out folder")
    args = parser.parse_args(argv)
    tallies, baseline = merged(args.out)
    if not tallies:
        print("no refusals in these sweeps")
        return 0
    print(table(tallies, baseline), end="")
    if near := split_table(tallies, "near"):
        print(f"\nThe near misses (forecast within {NEAR:g}x of the objective) by the late jobs "
              "the overload gate had counted when it refused them:\n")
        print(near, end="")
    if inflow := split_table(tallies, "inflow"):
        print("\nEvery refusal by the inflow (arrivals / ends over 30 s) the gate read when "
              "it refused:\n")
        print(inflow, end="")
    if margin := split_table(tallies, "margin"):
        print("\nEvery refusal on a forecast by the learned margin it was multiplied by:\n")
        print(margin, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
