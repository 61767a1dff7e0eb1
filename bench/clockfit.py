"""How long the learned clock's fit holds the daemon's event loop, with the host's cores
busy as an engine keeps them: `python -m bench.clockfit`.

It fills a StepClock's window with step samples of the tiny engine's shape, starts one
spinning process per core but one (an engine's worker spins on its core), pinned, and times
`fits` refits with the BLAS libraries as they load (a thread per core) and then as the
daemon runs them (daemon/blas.py: one thread), printing the median, p99 and longest fit.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import time
from collections.abc import Iterator

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from daemon.core.clock import WINDOW, StepClock
from daemon.core.costmodel import CostModel


def _spin(core: int) -> None:
    os.sched_setaffinity(0, {core})
    while True:
        pass


@contextlib.contextmanager
def _busy(cores: list[int]) -> Iterator[None]:
    spinners = [multiprocessing.get_context("spawn").Process(target=_spin, args=(core,),
                                                             daemon=True) for core in cores]
    for spinner in spinners:
        spinner.start()
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.join()


def _filled_clock(seed: int) -> StepClock:
    rng = np.random.default_rng(seed)
    clock = StepClock(CostModel())
    time_s, jobs = 0.0, [(f"j{i}", int(rng.integers(20, 600)), 1) for i in range(4)]
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
        clock._fit()
        times[i] = time.perf_counter() - start
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.clockfit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fits", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--spinners", type=int, default=-1,
                        help="cores kept busy (default: all but one)")
    args = parser.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    spun = cores[:-1] if args.spinners < 0 else cores[:args.spinners]
    clock = _filled_clock(args.seed)
    threads = max(info["num_threads"] for info in threadpool_info()
                  if info["user_api"] == "blas")
    print(f"{len(cores)} cores; spinning on {spun or 'none'}; {args.fits} fits of a "
          f"{WINDOW}-sample window each")
    with _busy(spun):
        time.sleep(1.0 if spun else 0.0)  # the spinners running
        for label, limit in ((f"BLAS as loaded ({threads} threads)", None),
                             ("one BLAS thread (daemon/blas.py)", 1)):
            with threadpool_limits(limits=limit, user_api="blas"):
                times = _time_fits(clock, args.fits) * 1e3
            print(f"{label:34s} fit median {np.median(times):7.2f} ms, p99 "
                  f"{np.percentile(times, 99):8.2f} ms, longest {times.max():8.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
