"""Simulations in a process pool with a progress bar, results in the order given."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

from tqdm import tqdm

T = TypeVar("T")


def run_pool(fn: Callable[..., T], jobs: Sequence[tuple[Any, ...]], workers: int = 2,
             desc: str = "runs") -> list[T]:
    """fn(*job) for every job (fn must be a module-level function: it is pickled)."""
    bar = tqdm(total=len(jobs), desc=desc, unit="run", leave=False)
    try:
        if workers <= 1:
            out = []
            for job in jobs:
                out.append(fn(*job))
                bar.update()
            return out
        # spawn: the parent may have loaded torch and tokenizers (the predictor); forking
        # them is unsafe, and the workers need neither.
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = [pool.submit(fn, *job) for job in jobs]
            for future in futures:
                future.add_done_callback(lambda _: bar.update())
            return [f.result() for f in futures]
    finally:
        bar.close()
