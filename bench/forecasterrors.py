"""Where the admission forecast errs: replay each forecast of lengthwise's core trace
(`lengthwise bench sweep --trace`, [scheduler] trace: daemon/core/trace.py) with the service
times that came true, and say which of them made the real wait differ from the forecast.

    python -m bench.forecasterrors OUT_OR_TRACE...

For every request accepted with a forecast wait behind at least one job (a queue forecast,
the kind that refuses), the real wait is its launch less its admission. The forecast is
replayed (admission.seconds_until_started, on the inputs the trace holds) as forecast, then
with the running jobs' real ends (each job's stop), with only their real token counts (at
the forecast's pace), with only their real pace (at the forecast's counts), and with the
real services of the jobs ahead too. A replay that matches the real wait says the forecast's
model of the queue is right and its inputs erred; the ones between say which input.

The last table asks what any margin on this forecast can do: refusing where forecast x k
passes the latest start, how many of the accepted requests it would have refused, how many
of those started late indeed, and how many late ones it would still accept.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from daemon.core import admission
from daemon.core.events import Capacity

BANDS = ((1, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 10**9))
MARGINS = (0.5, 0.7, 1.0, 1.4, 2.0, 2.8)
Record = dict[str, Any]


class Sample(NamedTuple):
    """One queue forecast and how it came out (seconds from its admission)."""

    depth: int  # jobs ahead at admission
    forecast: float  # the forecast replayed on its own inputs
    real: float  # admission -> launch
    deadline: float  # admission -> latest start
    running: float  # replayed with the running jobs' real ends
    tokens: float  # ... with only their real token counts
    pace: float  # ... with only their real pace
    both: float  # ... with the running jobs' real ends and the real services ahead


def traces(paths: list[Path]) -> list[Path]:
    """The trace files named, and those in the folders named."""
    found: list[Path] = []
    for path in paths:
        found += sorted(path.glob("*.trace.jsonl")) if path.is_dir() else [path] * path.is_file()
    return found


def read(path: Path) -> Iterator[Record]:
    with path.open() as lines:
        for line in lines:
            if line.strip():
                yield json.loads(line)


class Outcomes:
    """How one trace's jobs came out: their launches and stops."""

    def __init__(self, records: list[Record]) -> None:
        self.launches: dict[str, list[float]] = {}
        self.stops: dict[str, list[Record]] = {}
        for r in records:
            if r["ev"] == "launch":
                self.launches.setdefault(r["id"], []).append(r["t"])
            elif r["ev"] == "stop":
                self.stops.setdefault(r["id"], []).append(r)

    def stop_after(self, job_id: str, t: float) -> Record | None:
        return next((s for s in self.stops.get(job_id, []) if s["t"] > t), None)

    def service(self, job_id: str) -> float | None:
        """Seconds from the job's first launch to its end; None if it never ended so."""
        start = self.launches.get(job_id, [None])[0]
        end = None if start is None else self.stop_after(job_id, start)
        return None if start is None or end is None or not end["ended"] else end["t"] - start


def samples(records: list[Record], came: Outcomes) -> list[Sample]:
    """The queue forecasts of one trace (one daemon's run, whose jobs `came` so) with their
    replays."""
    out = []
    for a in records:
        if (a["ev"] != "admit" or a["refused"] or not a["ahead"] or a["id"] not in came.launches
                or a["latest"] is None):
            continue
        forecast = replay(a, came, "forecast")
        if not 0 < forecast < math.inf:
            continue
        t = a["t"]
        out.append(Sample(len(a["ahead"]), forecast, came.launches[a["id"]][0] - t,
                          a["latest"] - t, replay(a, came, "real"), replay(a, came, "tokens"),
                          replay(a, came, "pace"), replay(a, came, "real", ahead_real=True)))
    return out


def replay(admit: Record, came: Outcomes, ends: str, ahead_real: bool = False) -> float:
    """The forecast of an admission line, its running jobs ending as `ends` says (_end),
    the jobs ahead taking their predicted services or (`ahead_real`) their real ones."""
    t, best = admit["t"], math.inf
    line = [(context, (came.service(job_id) or predicted) if ahead_real else predicted)
            for job_id, context, predicted in admit["ahead"]]
    for lane in admit["lanes"]:
        timed = sorted((_end(t, seconds, lane["running"][job_id], came.stop_after(job_id, t),
                             ends), job_id) for seconds, job_id in lane["ends"])
        best = min(best, admission.seconds_until_started(
            Capacity(lane["name"], lane["kv_blocks"], lane["block"], lane["slots"]),
            _ledger(lane), timed, admit["context"], line, admit["step_s"], lane["slots"]))
    return best


def _ledger(lane: Record) -> admission.KVLedger:
    """The lane's KV ledger as the trace saw it: its block size and the contexts held (all
    the forecast reads of it)."""
    ledger = admission.KVLedger()
    ledger.block_size = lane["block"]
    for job_id, context in lane["contexts"].items():
        ledger.reserve(job_id, context, context)
    return ledger


def tokens_left(running: list[Any]) -> tuple[int, float]:
    """(tokens generated, tokens left as the forecast had them) of a running job's entry:
    [context, generated, the predictor's length, the forecast's tokens left]."""
    return running[1], running[3]


def _end(t: float, seconds: float, running: list[Any], stop: Record | None,
         which: str) -> float:
    """A running job's end, seconds after `t`: as forecast, or as it came (`which`: real;
    tokens: its real count at the forecast pace; pace: the forecast's count at its real
    pace)."""
    if stop is None or which == "forecast":
        return seconds
    real = stop["t"] - t
    generated, left = tokens_left(running)
    if which == "real" or left <= 1:
        return real
    share = max(stop["generated"] - generated, 1) / left  # real tokens / forecast left
    return seconds * share if which == "tokens" else real / share


def running_errors(records: list[Record], came: Outcomes) -> tuple[list[float], list[float]]:
    """Over every admission line, each running job that ended with at least 20 tokens left
    by the forecast: (its real tokens left / the forecast's, its real seconds per token
    / the forecast's)."""
    tokens, pace = [], []
    for a in records:
        if a["ev"] != "admit":
            continue
        for lane in a["lanes"]:
            for seconds, job_id in lane["ends"]:
                generated, left = tokens_left(lane["running"][job_id])
                stop = came.stop_after(job_id, a["t"])
                if left < 20 or stop is None or not stop["ended"] or seconds <= 0:
                    continue
                made = max(stop["generated"] - generated, 1)
                tokens.append(made / left)
                pace.append(((stop["t"] - a["t"]) / made) / (seconds / left))
    return tokens, pace


def _quantiles(values: list[float]) -> str:
    if not values:
        return "none"
    p10, p50, p90 = np.percentile(values, (10, 50, 90))
    return f"median {p50:.2f} (10th-90th percentile {p10:.2f}-{p90:.2f}, n {len(values)})"


def _median(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.median(finite)) if finite else math.nan


def report(found: list[Sample]) -> str:
    rows = [("| jobs ahead | forecasts | real / forecast | real ends of the running, / "
             "forecast | their tokens only | their pace only | and the real services ahead | "
             "real / that replay |"), "|---|---|---|---|---|---|---|---|"]
    for lo, hi in (*BANDS, (1, 10**9)):
        band = [s for s in found if lo <= s.depth <= hi]
        if not band:
            continue
        name = "all" if (lo, hi) == (1, 10**9) else (f"{lo}" if lo == hi else
                                                    f"{lo}+" if hi >= 10**9 else f"{lo}-{hi}")
        ratios = [_median([getattr(s, k) / s.forecast for s in band])
                  for k in ("real", "running", "tokens", "pace", "both")]
        fit = _median([s.real / s.both for s in band if s.both > 0])
        rows.append(f"| {name} | {len(band)} | " + " | ".join(f"{r:.2f}" for r in ratios)
                    + f" | {fit:.2f} |")
    spread = _median([abs(math.log(s.real / s.forecast)) for s in found if s.real > 0])
    replayed = _median([abs(math.log(s.real / s.both)) for s in found
                        if s.real > 0 and s.both > 0])
    rows += ["", (f"Median |log(real / forecast)|: {spread:.2f}; with the real services "
                  f"replayed: {replayed:.2f}."), "",
             ("| refuse where forecast x | would refuse | of them late | late, still "
              "accepted | right |"), "|---|---|---|---|---|"]
    for k in MARGINS:
        refused = [s.real > s.deadline for s in found if s.forecast * k > s.deadline]
        kept = [s.real > s.deadline for s in found if s.forecast * k <= s.deadline]
        right = f"{sum(refused) / len(refused):.0%}" if refused else "–"
        rows.append(f"| {k:g} | {len(refused)} | {sum(refused)} | {sum(kept)} | {right} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.forecasterrors", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", type=Path, nargs="+",
                   help="trace files, or sweep folders (their *.trace.jsonl)")
    args = p.parse_args(argv)
    files = traces(args.paths)
    if not files:
        raise SystemExit("no trace: run the sweep with --trace")
    found, tokens, pace = [], [], []
    for path in files:
        records = list(read(path))
        came = Outcomes(records)
        found += samples(records, came)
        more_tokens, more_pace = running_errors(records, came)
        tokens += more_tokens
        pace += more_pace
    print(f"{len(found)} queue forecasts of accepted requests in {len(files)} traces\n")
    print(report(found))
    print(f"\nThe running jobs at admission, real / forecast: tokens left {_quantiles(tokens)}; "
          f"seconds per token {_quantiles(pace)}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
