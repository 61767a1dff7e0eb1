"""How fast a server's engine stepped during a run, measured the same way for every server:
from vLLM's own bench client's per-request token times (its saved `ttfts`, `itls`,
`latencies`, `start_times`), not from either server's metrics.

Why not the servers' metrics: vLLM's server exports no step time (its
`vllm:inter_token_latency_seconds` is a per-request histogram of its front end, and
lengthwise, which replaces its engine's stat loggers, does not export it), and only
lengthwise has a learned clock (`lengthwise_step_coefficient_seconds`). The one instrument
both runs share is the client.

A decoding request gets one token per engine step, so the gap between two of its tokens is
one step. A step's time depends on the batch it ran, and the batch is the scheduler's
choice, so speeds are compared at matched batch sizes: each gap is filed under the number
of requests decoding at that moment (first token received, last not yet), in power-of-two
bins, and a bin's step time is the mean of its gaps, leaving out stalls over 4x the bin's
median (a request preempted and waiting, vLLM's recompute or lengthwise's). The mean, not
the median, so that two tokens the client read at once (a ~0 gap, then a double one) still
add up to two steps.

Where both servers log every engine step (`--step-log`: vLLM's own per-step line, which
lengthwise's stat logger writes too), those lines time the engine itself, with neither the
client nor a front end in the measure (from_step_lines); a sweep compares a pair's engines by
them when both runs have them. The client's view stays: a front end that delays its tokens shows
there, and only there.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from pathlib import Path

import msgspec
import numpy as np

STALL = 4.0  # a gap over this many times its bin's median is a stall, not a step
MIN_GAPS = 20  # gaps a bin needs in both runs to count in a comparison
FLAG_RATIO = 0.10  # a pair whose matched step times differ by more is flagged


class Bin(msgspec.Struct, frozen=True):
    batch: int  # the bin's largest batch: 1, 2, 4 (3-4), 8 (5-8), ...
    step_s: float  # mean gap, stalls left out
    gaps: int  # gaps kept (from step lines: steps)


class DecodeSpeed(msgspec.Struct, frozen=True, kw_only=True):
    step_s: float  # mean gap of the run, stalls (per bin) left out
    batch: float  # median number of requests decoding at a gap
    gaps: int
    bins: list[Bin]
    # The stalls left out: how many, their seconds summed, the longest. A request paused
    # (preempted and waiting, or behind a long prefill) shows here, not in step_s; its TPOT
    # pays for it.
    stalls: int = 0
    stall_s: float = 0.0
    longest_stall_s: float = 0.0


def _gaps(saved: dict) -> tuple[np.ndarray, np.ndarray]:
    """(gap seconds, the moment each gap ended) over every successful request."""
    gaps, ends = [], []
    for start, ttft, itl in zip(saved["start_times"], saved["ttfts"], saved["itls"],
                                strict=True):
        if not itl or not ttft or ttft <= 0:
            continue
        steps = np.asarray(itl, dtype=float)
        gaps.append(steps)
        ends.append(start + ttft + np.cumsum(steps))
    if not gaps:
        return np.empty(0), np.empty(0)
    return np.concatenate(gaps), np.concatenate(ends)


def _decoding(saved: dict, moments: np.ndarray) -> np.ndarray:
    """How many requests were decoding (first token in, last not yet) at each moment."""
    windows = [(s + t, s + lat) for s, t, lat in zip(saved["start_times"], saved["ttfts"],
                                                     saved["latencies"], strict=True)
               if t and t > 0 and lat and lat > t]
    first = np.sort([w[0] for w in windows])
    last = np.sort([w[1] for w in windows])
    return (np.searchsorted(first, moments, side="left")
            - np.searchsorted(last, moments, side="left"))


def decode_speed(saved: dict) -> DecodeSpeed | None:
    """The run's step times by batch (module doc); None when no request decoded."""
    gaps, ends = _gaps(saved)
    if not len(gaps):
        return None
    batch = np.maximum(_decoding(saved, ends - gaps / 2), 1)
    index = np.ceil(np.log2(batch)).astype(int)
    bins, kept, stalled = [], [], []
    for i in np.unique(index):
        mine = gaps[index == i]
        steady = mine <= STALL * np.median(mine)
        steps = mine[steady]
        bins.append(Bin(batch=int(2 ** i), step_s=float(steps.mean()), gaps=len(steps)))
        kept.append(steps)
        stalled.append(mine[~steady])
    every, stalls = np.concatenate(kept), np.concatenate(stalled)
    return DecodeSpeed(step_s=float(every.mean()), batch=float(np.median(batch)),
                       gaps=len(every), bins=bins, stalls=len(stalls),
                       stall_s=float(stalls.sum()),
                       longest_stall_s=float(stalls.max()) if len(stalls) else 0.0)


# vLLM's per-step line (enable_logging_iteration_details), as vLLM's server and
# lengthwise's stat logger write it: "Iteration(812): 0 context requests, 0 context tokens,
# 11 generation requests, 11 generation tokens, iteration elapsed time: 3.41 ms, ..."
_STEP_LINE = re.compile(r"Iteration\(\d+\): (\d+) context requests, \d+ context tokens, "
                        r"(\d+) generation requests, (\d+) generation tokens, iteration "
                        r"elapsed time: ([\d.]+) ms")


Step = tuple[int, int, int, float]  # context requests, generation requests, tokens, seconds


def _step(line: str) -> Step | None:
    found = _STEP_LINE.search(line)
    if found is None:
        return None
    return int(found[1]), int(found[2]), int(found[3]), float(found[4]) / 1000


def from_step_lines(lines: Iterable[str]) -> DecodeSpeed | None:
    """The engine's own step times by batch, from its step lines in a server's log
    (`--step-log`): decode-only steps (no prompt in them, and one token per request: vLLM
    counts the recompute of a preempted request's output, whose prompt the prefix cache
    still held, as generation tokens), filed by the requests they decoded in the same
    power-of-two bins as decode_speed, a bin's step time their mean.
    None when no decode-only step was logged. The time is the engine core's wait for its
    model's output (the worker's step and the hand-back): no client or front end in the
    measure, though sharing the CPU they can still slow it."""
    return _speed([step for line in lines if (step := _step(line)) is not None])


def steps_at(lines: Iterable[str], batch: int) -> list[float]:
    """Seconds of each decode-only step (as from_step_lines) that decoded exactly `batch`
    requests, from a server's step lines."""
    steps = (step for line in lines if (step := _step(line)) is not None)
    return [seconds for requests, seconds in _decode_only(steps) if requests == batch]


def _decode_only(steps: Iterable[Step]) -> list[tuple[int, float]]:
    """(requests, seconds) of the decode-only steps: no prompt in them, one token each."""
    return [(requests, seconds) for context, requests, tokens, seconds in steps
            if context == 0 and 0 < requests == tokens]


def _speed(steps: Iterable[Step]) -> DecodeSpeed | None:
    decoding = _decode_only(steps)
    if not decoding:
        return None
    batch, step = (np.asarray(values) for values in zip(*decoding, strict=True))
    index = np.ceil(np.log2(batch)).astype(int)
    bins = [Bin(batch=int(2 ** i), step_s=float(step[index == i].mean()),
                gaps=int((index == i).sum())) for i in np.unique(index)]
    return DecodeSpeed(step_s=float(step.mean()), batch=float(np.median(batch)),
                       gaps=len(step), bins=bins)


_CLOCK = re.compile(r"\b(\d\d):(\d\d):(\d\d)\b")  # both logs' time of day, to the second
RUN_GAP_S = 3.0  # idle seconds between two steps that end one run's segment of a log


class Window(msgspec.Struct, frozen=True, kw_only=True):
    """The engine's steps over `window_s` of a run, from its step lines."""

    start_s: float  # from the segment's first step
    steps: int
    busy: float  # the share of the window spent in steps (their elapsed times summed)
    tokens_per_s: float  # generation tokens
    bins: list[Bin]  # decode-only steps by batch, as from_step_lines


def step_windows(lines: Iterable[str], window_s: float = 5.0) -> list[list[Window]]:
    """Each run's engine steps in windows of `window_s` (the log's time of day, to the
    second): how the step time at one batch size moves within a run, which a whole run's
    ratio averages away. A log holds the runs of one server start: RUN_GAP_S without a
    step starts a new segment (a run, or a warm-up)."""
    segments: list[list[tuple[int, Step]]] = []
    last = None
    for line in lines:
        step, clock = _step(line), _CLOCK.search(line)
        if step is None or clock is None:
            continue
        t = int(clock[1]) * 3600 + int(clock[2]) * 60 + int(clock[3])
        if last is None or not 0 <= t - last <= RUN_GAP_S:
            segments.append([])
        last = t
        segments[-1].append((t, step))
    out = []
    for timed in segments:
        windows: dict[int, list[Step]] = {}
        for t, step in timed:
            windows.setdefault(int((t - timed[0][0]) // window_s), []).append(step)
        out.append([Window(start_s=k * window_s, steps=len(group),
                           busy=sum(step[3] for step in group) / window_s,
                           tokens_per_s=sum(step[2] for step in group) / window_s,
                           bins=speed.bins if (speed := _speed(group)) else [])
                    for k, group in sorted(windows.items())])
    return out


def from_result_file(path: Path) -> DecodeSpeed | None:
    """decode_speed of a result vLLM's client saved (--save-detailed); None if absent."""
    if not path.is_file():
        return None
    return decode_speed(json.loads(path.read_text()))


def speed_ratio(base: DecodeSpeed, other: DecodeSpeed, min_gaps: int = MIN_GAPS
                ) -> tuple[float, bool]:
    """(other's step time / base's, matched): the geometric mean of the per-bin ratios
    over the batch bins both runs filled with min_gaps gaps, weighted by the smaller count;
    matched False when they share none and the ratio is of the runs' overall step times."""
    theirs = {b.batch: b for b in other.bins if b.gaps >= min_gaps}
    logs, weights = [], []
    for mine in base.bins:
        if mine.gaps >= min_gaps and mine.batch in theirs:
            logs.append(math.log(theirs[mine.batch].step_s / mine.step_s))
            weights.append(min(mine.gaps, theirs[mine.batch].gaps))
    if not logs:
        return other.step_s / base.step_s, False
    return math.exp(float(np.average(logs, weights=weights))), True


def flagged(ratio: float, limit: float = FLAG_RATIO) -> bool:
    """Engine speeds differ by more than `limit` either way."""
    return not (1 - limit) <= ratio <= (1 + limit)


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.enginespeed RESULT.json...`: each saved run's step time, its stalls;
    `--windows SECONDS LOG...`: each run's engine steps per window, from a server's log."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench.enginespeed",
                                     description="Step time and stalls of runs vLLM's client "
                                     "saved (--save-detailed), such as a sweep's "
                                     "OUT/vllm-client/*.result.json; or, with --windows, the "
                                     "engine's own steps per window of a run, from a server's "
                                     "log with step lines (a sweep's OUT/SYSTEM-REPEAT.log "
                                     "with --step-log).")
    parser.add_argument("paths", nargs="+", type=Path, metavar="FILE")
    parser.add_argument("--windows", type=float, metavar="SECONDS",
                        help="read FILEs as server logs: steps per window of SECONDS")
    args = parser.parse_args(argv)
    if args.windows:
        for path in args.paths:
            with path.open(errors="replace") as lines:
                _print_windows(path.name, step_windows(lines, args.windows))
        return 0
    print("| run | step (ms) | batch | gaps | stalls | stalled (s) | longest (s) |")
    print("|---|---|---|---|---|---|---|")
    for path in args.paths:
        speed = from_result_file(path)
        if speed is None:
            print(f"| {path.name} | – | – | 0 | – | – | – |")
            continue
        print(f"| {path.name} | {speed.step_s * 1000:.2f} | {speed.batch:g} | {speed.gaps} | "
              f"{speed.stalls} | {speed.stall_s:.1f} | {speed.longest_stall_s:.2f} |")
    return 0


def _print_windows(name: str, segments: list[list[Window]]) -> None:
    for k, windows in enumerate(segments):
        sizes = sorted({b.batch for window in windows for b in window.bins})
        print(f"\n{name}, segment {k + 1} of {len(segments)}: decode step (ms) by batch "
              f"(steps)\n")
        print("| from (s) | steps | busy | tokens/s | "
              + " | ".join(f"batch <= {size}" for size in sizes) + " |")
        print("|---" * (len(sizes) + 4) + "|")
        for window in windows:
            by = {b.batch: b for b in window.bins}
            cells = [f"{by[size].step_s * 1000:.1f} ({by[size].gaps})" if size in by else "–"
                     for size in sizes]
            print(f"| {window.start_s:g} | {window.steps} | {window.busy:.0%} | "
                  f"{window.tokens_per_s:.0f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    raise SystemExit(main())
