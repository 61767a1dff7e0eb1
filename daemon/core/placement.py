"""Where a job goes among executors with a free slot: `[scheduler] placement`.

"predicted" (the default) is the policy's own choice, by predicted outstanding work. The
others ignore predictions, as routers do that see only queue lengths; they exist so that a
fleet benchmark (`lengthwise bench fleet`) compares lengthwise's placement with them on the
same core and the same policy.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from daemon.core.job import Job
from daemon.core.policy import ExecutorView, Placement


def least_queue(job: Job, free: Sequence[ExecutorView]) -> ExecutorView:
    """Fewest waiting + running requests (the EPP's default queue scorer). Jobs wait in
    lengthwise, not in an engine, so an executor's queue is its running jobs; ties go to
    the first executor in order."""
    return min(free, key=lambda ex: len(ex.running))


class RoundRobin:
    """Executors in turn: the free executor that was handed a job least recently (plain
    rotation while all have room; a full one is skipped, not waited for)."""

    def __init__(self) -> None:
        self._turn = itertools.count()
        self._last: dict[str, int] = {}  # executor name -> turn it last got a job

    def __call__(self, job: Job, free: Sequence[ExecutorView]) -> ExecutorView:
        ex = min(free, key=lambda e: self._last.get(e.name, -1))
        self._last[ex.name] = next(self._turn)
        return ex


def make(name: str) -> Placement | None:
    """The placement called `name`; None for "predicted": the policy's own."""
    if name == "predicted":
        return None
    if name == "least_queue":
        return least_queue
    if name == "round_robin":
        return RoundRobin()
    raise ValueError(f"unknown placement {name!r}: predicted | least_queue | round_robin")
