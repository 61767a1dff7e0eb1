"""The first tokens past their objective, one system against the baseline, per load, over
the pairs of several sweeps run with --slo-ttft:

    python -m bench.late --system lengthwise:ssjf OUT1 OUT2 ...

For each: the requests served whose first token came later than the TTFT objective (how
many, their mean, p90 and longest first token) and the requests refused. With objectives,
lengthwise waits a job that can no longer meet its objective behind every job that still
can (daemon/core/waitqueue.py): fewer jobs turn late, and those that do wait longer. A
request's p99 first token is then a late job's, so this shows both sides of that trade
(the count and the lateness) where the p99 shows one.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import msgspec
import numpy as np

from bench import sweepstats as stats
from bench.servers import parse_system
from bench.sweep import RunFile, load_results, run_file


def late_first_tokens(out: Path, system: str, baseline: str
                      ) -> dict[float, dict[str, list[float]]]:
    """{load: {"system"/"baseline": first tokens (s) past the objective, "…:refused":
    [count per run], "…:served": [count per run]}} over the (load, repetition) pairs both
    systems ran in the sweep at `out`."""
    results = load_results(out / "sweep.json")
    if results.slo_ttft is None:
        raise SystemExit(f"{out}: ran without --slo-ttft")
    found: dict[float, dict[str, list[float]]] = {}
    for run, ref in stats.paired(results.runs, baseline):
        if run.system != system:
            continue
        cells = found.setdefault(run.load, {})
        for role, each in (("system", run), ("baseline", ref)):
            path = run_file(out, parse_system(each.system).label, each.load, each.repeat)
            requests = msgspec.json.decode(path.read_bytes(), type=RunFile).requests
            cells.setdefault(role, []).extend(
                r.ttft_s for r in requests
                if r.ok and r.ttft_s is not None and r.ttft_s > results.slo_ttft)
            cells.setdefault(f"{role}:refused", []).append(
                sum(not r.ok and "Too Many Requests" in r.error for r in requests))
            cells.setdefault(f"{role}:served", []).append(sum(r.ok for r in requests))
    return found


def _cell(late: list[float]) -> str:
    if not late:
        return "0"
    ms = np.asarray(late) * 1e3
    return (f"{len(ms)}: {ms.mean():.0f} / {np.percentile(ms, 90):.0f} / {ms.max():.0f}")


def table(sources: Sequence[Path], system: str, baseline: str) -> str:
    pooled: dict[float, dict[str, list[float]]] = {}
    for out in sources:
        for load, cells in late_first_tokens(out, system, baseline).items():
            for key, values in cells.items():
                pooled.setdefault(load, {}).setdefault(key, []).extend(values)
    head = (f"| load | pairs | served late, {system}: n: mean / p90 / longest first token "
            f"(ms) | served late, {baseline} | refused, {system} / {baseline} |")
    lines = [head, "|---|---|---|---|---|"]
    for load, cells in sorted(pooled.items()):
        lines.append(f"| {load:g}x | {len(cells['system:served'])} | "
                     f"{_cell(cells['system'])} | {_cell(cells['baseline'])} | "
                     f"{sum(cells['system:refused']):g} / {sum(cells['baseline:refused']):g} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.late", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outs", nargs="+", type=Path, metavar="OUT")
    parser.add_argument("--system", required=True)
    parser.add_argument("--baseline", default="vllm")
    args = parser.parse_args(argv)
    print(table(args.outs, args.system, args.baseline))


if __name__ == "__main__":
    main()
