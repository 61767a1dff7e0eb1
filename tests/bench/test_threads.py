"""bench/threads.py: the host's threads from /proc, and where an engine worker waited."""

from __future__ import annotations

import os
import threading
from typing import Any

from bench.threads import Thread, report, threads


def test_threads_lists_this_process_and_its_threads() -> None:
    done = threading.Event()
    helper = threading.Thread(target=done.wait, name="helper")
    helper.start()
    try:
        mine = [t for t in threads() if t.pid == os.getpid()]
    finally:
        done.set()
        helper.join()
    assert len(mine) >= 2  # the main thread and the helper
    main = next(t for t in mine if t.tid == os.getpid())
    assert main.ppid == os.getppid() and main.ticks >= 0 and main.core in os.sched_getaffinity(0)


def _sample(t: float, worker_run_s: float, worker_wait_s: float, engine_run_s: float,
            client_run_s: float, worker_core: int = 0) -> dict[str, Any]:
    ns = 1_000_000_000
    return {"t": t, "threads": [
        Thread(100, 100, 99, "VLLM::Worker", 0, worker_core, int(worker_run_s * ns),
               int(worker_wait_s * ns)),
        # a second OpenMP thread of the worker, on the next core
        Thread(100, 101, 99, "VLLM::Worker", 0, worker_core + 1, int(worker_run_s / 2 * ns), 0),
        Thread(99, 99, 1, "VLLM::EngineCor", 0, 1, int(engine_run_s * ns), 0),
        Thread(99, 98, 1, "ZMQbg/IO/0", 0, 1, int(engine_run_s * ns / 10), 0),
        Thread(50, 50, 1, "python", 0, 1, int(client_run_s * ns), 0)]}


def test_report_counts_the_busy_seconds_of_each_worker() -> None:
    samples = [_sample(0.0, 0, 0, 0, 0),
               _sample(1.0, 0.9, 0.08, 0.6, 0.1),  # busy
               _sample(2.0, 1.8, 0.18, 1.2, 0.3),  # busy
               _sample(3.0, 1.81, 0.18, 1.2, 0.3)]  # idle: not counted
    (row,) = report(samples)
    assert row.pid == 100 and row.busy_s == 2.0 and row.cores == "0,1"
    assert abs(row.runs - 1.35) < 1e-9 and abs(row.waits - 0.09) < 1e-9  # both threads
    others = dict(row.others)
    assert abs(others["EngineCore"] - 0.66) < 1e-9  # both of its threads
    assert abs(others["python"] - 0.15) < 1e-9
