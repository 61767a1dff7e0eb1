"""Aging's look-ahead guard: start the earliest deadline before a policy's pick makes a
waiting job miss the wait bound it would otherwise meet.

Starts are estimated by list-scheduling the first `LOOKAHEAD` waiting jobs in deadline order
on every slot (running jobs' predicted remaining service first). Measured in the simulator
(docs/policies.md): with service estimates on the right scale it holds p99 at FCFS's while
the policy keeps most of its mean gain.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from daemon.core.job import Job
from daemon.core.waitqueue import WaitQueue

LOOKAHEAD = 64  # waiting jobs, by deadline, whose starts the guard estimates


def list_starts(slots: list[float], services: list[float]) -> list[float]:
    """When each job (its service seconds) starts, jobs started in the given order each on
    the earliest free of `slots` (seconds from now until each frees); list scheduling, as
    the guard and admission's forecasts (core/slo.py) estimate starts."""
    free = list(slots)
    heapq.heapify(free)
    out = []
    for service in services:
        start = heapq.heappop(free)
        out.append(start)
        heapq.heappush(free, start + service)
    return out


def starts_within(deadlines: list[float], services: list[float], slots: list[float],
                  now: float) -> list[bool]:
    """Whether each job (its deadline and service seconds), started in the given order on
    the earliest free of `slots` (seconds from now until each frees), starts in time."""
    starts = list_starts(slots, services)
    return [now + start <= deadline for start, deadline in zip(starts, deadlines, strict=True)]


def overrule(pick: Job, waiting: WaitQueue, service: Callable[[Job], float],
             running: Sequence[Job], num_slots: int, now: float) -> Job | None:
    """The earliest-deadline waiting job if launching `pick` now would make some job miss a
    deadline it meets when jobs start in deadline order; None to keep the pick."""
    edf = waiting.by_deadline(LOOKAHEAD)
    if not edf or edf[0] is pick:
        return None
    busy = [service(j) for j in running]
    slots = busy + [0.0] * max(num_slots - len(busy), 1)
    rest = [j for j in edf if j is not pick]
    deadlines = [waiting.deadline(j) for j in rest]
    services = [service(j) for j in rest]
    on_time = starts_within(deadlines, services, slots, now)
    heapq.heapify(slots)
    first = heapq.heappop(slots)  # the pick takes the first free slot
    heapq.heappush(slots, first + service(pick))
    after = starts_within(deadlines, services, slots, now)
    if all(a or not b for a, b in zip(after, on_time, strict=True)):
        return None
    return edf[0]
