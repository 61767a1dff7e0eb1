"""How long the learned clock's fit holds the daemon's event loop: `python -m bench.clockfit`.

The sweeps' loop watchdog (daemon/http/loopwatch.py) caught the loop standing still 1.3-3.0
s inside the fit (core/clock.py `fit`, scipy's bvls) six times, when it ran on the loop.
The fit alone takes about a millisecond. This fills a StepClock's window with step samples
of the tiny engine's shape and times `fits` refits alone, then beside one thread busy in
Python (the daemon's predictor runs in a worker thread; how busy it was during the stalls
is not known): each time the fit's numpy calls let go of the GIL, it waits for the other
thread to give it back (up to sys.getswitchinterval(), 5 ms, and longer when that thread
waits for a core). Then, in each setting, how late a 1 ms timer on an event loop fires
while the same fits run back to back on that loop (as before core/refits.py) and in a
worker thread (as the daemon fits now). `--spinners N` keeps N cores busy as an engine's
worker does. Prints the median, p99 and longest of each.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from daemon.core.clock import WINDOW, StepClock, fit
from daemon.core.costmodel import CostModel


def _spin(core: int) -> None:
    os.sched_setaffinity(0, {core})
    while True:
        pass


@contextlib.contextmanager
def _spinning(cores: list[int]) -> Iterator[None]:
    spinners = [multiprocessing.get_context("spawn").Process(target=_spin, args=(core,),
                                                             daemon=True) for core in cores]
    for spinner in spinners:
        spinner.start()
    try:
        if spinners:
            time.sleep(1.0)  # running
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.join()


@contextlib.contextmanager
def _python_busy_thread() -> Iterator[None]:
    done = threading.Event()

    def busy() -> None:
        count = 0
        while not done.is_set():
            count += 1

    thread = threading.Thread(target=busy, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _filled_clock(seed: int) -> StepClock:
    rng = np.random.default_rng(seed)
    clock = StepClock(CostModel())
    time_s = 0.0
    for _ in range(WINDOW + 1):
        batch = int(rng.integers(1, 17))
        jobs = [(f"j{i}", int(rng.integers(20, 1500)), 1) for i in range(batch)]
        time_s += 0.002 + 0.0001 * batch + rng.exponential(0.0003)
        clock.step(time_s, jobs)
    return clock


def _time_fits(clock: StepClock, fits: int) -> np.ndarray:
    times = np.empty(fits)
    for i in range(fits):
        start = time.perf_counter()
        clock.refit()
        times[i] = time.perf_counter() - start
    return times


async def _timer_lateness(clock: StepClock, fits: int, worker: ThreadPoolExecutor | None
                          ) -> np.ndarray:
    """Seconds each 1 ms timer on this loop fired late while `fits` fits ran back to back,
    on the loop (worker None) or in the worker."""
    loop, late, fitting = asyncio.get_running_loop(), [], True

    async def probe() -> None:
        while fitting:
            start = loop.time()
            await asyncio.sleep(0.001)
            late.append(loop.time() - start - 0.001)

    probing = asyncio.create_task(probe())
    await asyncio.sleep(0.002)
    for _ in range(fits):
        if worker is None:
            fit(clock.window())
            await asyncio.sleep(0)
        else:
            await loop.run_in_executor(worker, fit, clock.window())
    fitting = False
    await probing
    return np.maximum(np.asarray(late), 0.0)


def _line(label: str, seconds: np.ndarray) -> str:
    ms = seconds * 1e3
    return (f"{label:36s} median {np.median(ms):7.2f} ms, p99 {np.percentile(ms, 99):8.2f} ms, "
            f"longest {ms.max():8.2f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.clockfit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fits", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--spinners", type=int, default=0, help="cores kept busy")
    args = parser.parse_args(argv)
    spun = sorted(os.sched_getaffinity(0))[:args.spinners]
    clock = _filled_clock(args.seed)
    print(f"{os.cpu_count()} cores, spinning on {spun or 'none'}; {args.fits} fits of a "
          f"{WINDOW}-sample window each")
    with _spinning(spun), ThreadPoolExecutor(max_workers=1) as worker:
        for label, beside in (("alone", contextlib.nullcontext),
                              ("beside a thread busy in Python", _python_busy_thread)):
            with beside():
                times = _time_fits(clock, args.fits)
                inline = asyncio.run(_timer_lateness(clock, args.fits, None))
                apart = asyncio.run(_timer_lateness(clock, args.fits, worker))
            print(_line(f"{label}: fit", times))
            print(_line("  loop timer late, fit on the loop", inline))
            print(_line("  loop timer late, fit in a worker", apart))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
