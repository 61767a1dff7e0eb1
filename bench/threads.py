"""Where the engine's worker waits: every thread on the host, sampled from /proc.

`python -m bench.threads sample OUT.jsonl` writes, every 0.5 s until stopped, each thread's
CPU time, the core it last ran on and the time it spent runnable but not running (Linux
schedstat). Run it beside a sweep; then `python -m bench.threads report OUT.jsonl` prints,
for each engine worker (a `VLLM::Worker` process) over the seconds it was busy, the cores
it ran, how long it waited for a core, and who else took CPU meanwhile (its EngineCore,
by thread name). docs/results/2026-11-29-worker-cores-and-best-effort-pooled.md has the
figures it gave.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

BUSY_CORES = 0.3  # a worker running at least this much of a core in an interval is busy


class Thread(NamedTuple):
    pid: int
    tid: int
    ppid: int
    name: str
    ticks: int  # user + system CPU, clock ticks
    core: int  # the core it last ran on
    run_ns: int  # schedstat: time on a core
    wait_ns: int  # schedstat: time runnable, waiting for a core


def threads(proc: Path = Path("/proc")) -> Iterator[Thread]:
    for pid in (p for p in os.listdir(proc) if p.isdigit()):
        try:
            tids = os.listdir(proc / pid / "task")
        except OSError:  # ended
            continue
        for tid in tids:
            task = proc / pid / "task" / tid
            try:
                stat = (task / "stat").read_text()
                run, wait, _ = (task / "schedstat").read_text().split()
            except (OSError, ValueError):
                continue
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            yield Thread(int(pid), int(tid), int(fields[1]), name,
                         int(fields[11]) + int(fields[12]), int(fields[36]), int(run), int(wait))


def sample(out: Path, interval_s: float = 0.5) -> None:
    with out.open("w") as sink:
        while True:
            started = time.time()
            sink.write(json.dumps({"t": started, "threads": list(threads())}) + "\n")
            sink.flush()
            time.sleep(max(0.0, interval_s - (time.time() - started)))


class WorkerReport(NamedTuple):
    pid: int
    busy_s: float
    cores: str  # the cores its threads ran on
    runs: float  # cores it used while busy (all its threads)
    waits: float  # seconds its threads were runnable, not running, per second
    others: list[tuple[str, float]]  # (thread name, cores) of the rest, largest first


def report(samples: list[dict[str, Any]], top: int = 6) -> list[WorkerReport]:
    """Per engine worker process, over the intervals it was busy."""
    busy: dict[int, float] = collections.defaultdict(float)
    run: dict[int, float] = collections.defaultdict(float)
    wait: dict[int, float] = collections.defaultdict(float)
    cores: dict[int, set[int]] = collections.defaultdict(set)
    others: dict[int, dict[str, float]] = collections.defaultdict(
        lambda: collections.defaultdict(float))
    for before, after in itertools.pairwise(samples):
        seconds = after["t"] - before["t"]
        old = {(t[0], t[1]): Thread(*t) for t in before["threads"]}
        deltas = [(t, t.run_ns - old[t.pid, t.tid].run_ns, t.wait_ns - old[t.pid, t.tid].wait_ns)
                  for t in map(Thread._make, after["threads"]) if (t.pid, t.tid) in old]
        for worker in (t for t, _, _ in deltas
                       if t.name.startswith("VLLM::Worker") and t.pid == t.tid):
            pid = worker.pid
            mine = [(t, ran, waited) for t, ran, waited in deltas if t.pid == pid]
            ran_s = sum(ran for _, ran, _ in mine) / 1e9  # all its threads (OpenMP's)
            if ran_s / seconds < BUSY_CORES:
                continue
            busy[pid] += seconds
            run[pid] += ran_s
            wait[pid] += sum(waited for _, _, waited in mine) / 1e9
            cores[pid].update(t.core for t, ran, _ in mine if ran > 0)
            for thread, other_ran, _ in deltas:
                if thread.pid != pid:
                    label = ("EngineCore" if thread.pid == worker.ppid else thread.name)
                    others[pid][label] += other_ran / 1e9
    return [WorkerReport(pid, busy[pid], ",".join(map(str, sorted(cores[pid]))),
                         run[pid] / busy[pid], wait[pid] / busy[pid],
                         sorted(((name, v / busy[pid]) for name, v in others[pid].items()),
                                key=lambda item: -item[1])[:top])
            for pid in sorted(busy)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.threads", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("sample", "report"))
    parser.add_argument("path", type=Path, help="the samples (JSON lines)")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    args = parser.parse_args(argv)
    if args.action == "sample":
        sample(args.path, args.interval)
        return
    samples = [json.loads(line) for line in args.path.open()]
    rows = report(samples)
    if not rows:
        print(f"no engine worker (VLLM::Worker) was busy in the {len(samples)} samples")
    for row in rows:
        print(f"worker {row.pid}: busy {row.busy_s:.0f} s on core {row.cores}: runs "
              f"{row.runs:.2f} cores, waits runnable {row.waits:.3f} s/s; others: "
              + ", ".join(f"{name} {cores:.2f}" for name, cores in row.others))


if __name__ == "__main__":
    main()
