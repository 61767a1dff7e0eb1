"""The waiting set: policy order within priority classes, jobs that can still meet a latency
objective ahead of the rest of their class, plus aging that bounds every wait."""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar, cast

from daemon.core.job import Job

OrderKey = Callable[[Job], float]
WaitBound = Callable[[Job], float]  # seconds of total wait a job may accumulate
# (promotion time, latest start) of an on-time job under its objective (core/slo.py)
SloTimes = Callable[[Job], "tuple[float, float] | None"]
_Entry = tuple[int, float, int, Job]  # (rank: class and tier, policy key, seq, job)
_AgeEntry = tuple[float, int, Job]  # (loop time its wait bound is reached, seq, job)
_T = TypeVar("_T", _Entry, _AgeEntry)


class WaitQueue:
    """A heap on (rank, policy key), a heap on wait deadlines for aging, and one on latest
    starts for latency objectives.

    A job's rank is its priority class, then its tier: jobs that can still meet their
    latency objective (job.on_time) before best-effort and late ones. Within a tier jobs
    go in the policy's order, but for on-time jobs in overload (`by_slack`, set by the
    core): then by slack, earliest latest start first, as admission forecasts them (core/
    forecast.py). An on-time job's deadline is its promotion time under its objective, when
    that is earlier than aging's; at its latest start `expire` hands it back to the core (to
    shed, or to wait on: in its place, or behind as best effort, `late_in_place`).

    Each job may wait `bound(job)` seconds in *total*: every interval it spent here, across
    preemptions and slices, so a job that keeps being sent back cannot dodge promotion.
    While it waits its deadline is fixed, `enqueue_time - waited_s + bound(job)`. A job
    past its deadline is promoted: it goes ahead of every non-promoted job, earliest
    deadline first; otherwise the policy heap's best goes. The deadline heap is re-keyed
    only when a job's prediction (hence its bound) changes, or on reload.

    `pop` is O(log n). Removal is lazy: entries of jobs that left (or were re-keyed, which
    gives them a new seq) are skipped when they surface.
    """

    def __init__(self, order_key: OrderKey, bound: WaitBound | None,
                 slo_times: SloTimes | None = None) -> None:
        self._order_key = order_key
        self.bound = bound  # None disables aging
        self.slo_times = slo_times  # None: objectives never move a job
        self.by_slack = False  # on-time jobs by latest start (order_by_slack)
        # A job that turned late keeps its place among the on-time jobs of its class (by its
        # latest start, passed, in slack order) instead of waiting behind them ([slo] late).
        self.late_in_place = True
        self._seq = itertools.count()
        self._heap: list[_Entry] = []
        self._ages: list[_AgeEntry] = []
        self._expiry: list[_AgeEntry] = []  # (latest start, seq, job) of on-time jobs
        self._live: dict[str, tuple[int, Job]] = {}  # job id -> (current seq, job)

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, job: Job) -> bool:
        return job.job_id in self._live

    def __iter__(self) -> Iterator[Job]:
        return (job for _, job in self._live.values())

    @staticmethod
    def rank(job: Job) -> int:
        """Class first (lower = more urgent), then on-time jobs before the rest."""
        return 2 * job.priority + (0 if job.on_time else 1)

    def push(self, job: Job) -> None:
        times = self._slo_times(job)
        seq = self._add(job, times)
        if times is not None:
            heapq.heappush(self._expiry, (times[1], seq, job))
        deadline = self.deadline(job, times)
        if deadline < float("inf"):
            heapq.heappush(self._ages, (deadline, seq, job))

    def expire(self, now: float) -> list[Job]:
        """On-time jobs past their latest start (they stay here: the caller re-keys them
        as late, or removes them)."""
        late: list[Job] = []
        heap = self._expiry
        while heap and heap[0][0] <= now:
            _, seq, job = heapq.heappop(heap)
            if self._is_live(seq, job):
                late.append(job)
        return late

    def expiry_due(self) -> float | None:
        """Loop time of the earliest latest start of an on-time job; None if none."""
        heap = self._expiry
        while heap and not self._is_live(heap[0][1], heap[0][2]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def overtaken(self, started: Sequence[tuple[int, float]]) -> None:
        """Jobs of these (priority class, loop time their wait started) just left to run:
        each waiting job whose wait started earlier was overtaken by each of them of its
        class or a less urgent one (a more urgent class goes first under FCFS too). One
        that reaches its overtake budget is promoted (bounded overtaking,
        AgingConfig.overtaking). O(n log k)."""
        by_class: dict[int, list[float]] = {}
        for priority, start in started:
            by_class.setdefault(priority, []).append(start)
        for starts in by_class.values():
            starts.sort()
        for _, job in list(self._live.values()):
            if job.overtake_budget is None or job.overtakes_spent:
                continue
            since = self.wait_started(job)
            job.overtaken += sum(len(starts) - bisect.bisect_right(starts, since)
                                 for priority, starts in by_class.items()
                                 if priority >= job.priority)
            if job.overtakes_spent:
                self.push(job)  # re-keyed: its deadline is now its wait's start

    def remove(self, job: Job) -> bool:
        return self._live.pop(job.job_id, None) is not None

    def peek(self, now: float) -> Job | None:
        oldest = self.oldest_promoted(now)
        if oldest is not None:
            return oldest
        self._drop_stale()
        return self._heap[0][3] if self._heap else None

    def pop(self, now: float) -> Job | None:
        job = self.peek(now)
        if job is not None:
            del self._live[job.job_id]
        return job

    def best(self, now: float, n: int) -> list[Job]:
        """The first n jobs in dispatch order (promoted by age, then the heap); O(n log size)."""
        out = self.promoted(now, n)
        taken = {job.job_id for job in out}
        for entry in self._take(self._heap, n, lambda e: True):
            if len(out) < n and entry[3].job_id not in taken:
                out.append(entry[3])
        return out

    def promoted(self, now: float, n: int) -> list[Job]:
        """Up to n jobs past their wait deadline, earliest deadline first."""
        return [age[2] for age in self._take(self._ages, n, lambda e: self._promoted(e, now))]

    def by_deadline(self, n: int) -> list[Job]:
        """Up to n waiting jobs, earliest wait deadline first (none without aging)."""
        return [age[2] for age in self._take(self._ages, n, lambda e: True)]

    def keyed(self) -> list[tuple[int, float, Job]]:
        """(class, policy key, job) of every waiting job, in no particular order; O(n)."""
        live = self._live  # inlined liveness test: this runs over thousands of entries
        return [(prio, key, job) for prio, key, seq, job in self._heap
                if (entry := live.get(job.job_id)) is not None and entry[0] == seq]

    def sheddable_for(self, job: Job, spared: set[str]) -> Job | None:
        """A waiting sheddable job of a less urgent class than `job` (the least urgent, the
        latest-queued of those), to drop so that `job` gets its room; None if none."""
        victims = [other for other in self if other.slo is not None and other.slo.sheddable
                   and other.priority > job.priority and other.job_id not in spared]
        if not victims:
            return None
        return max(victims, key=lambda other: (other.priority, other.enqueue_time))

    def update(self, job: Job) -> None:
        """Re-key one waiting job (its prediction changed); its total wait is kept."""
        if job.job_id in self._live:
            self.push(job)

    def order_by_slack(self, on: bool) -> None:
        """On-time jobs by slack (`on`: in overload) or in the policy's order; re-keys every
        waiting job when that changes (O(n log n), once per change)."""
        if on != self.by_slack:
            self.by_slack = on
            self.refresh()

    def refresh(self) -> None:
        """Re-key every waiting job under the same order and bound: their keys or their
        objectives' times changed (slack order on or off, a reload of [slo])."""
        self.rekey(self._order_key, self.bound)

    def rekey(self, order_key: OrderKey, bound: WaitBound | None) -> None:
        """Adopt a new policy's order and wait bound (reload, a new clock); total waits
        are kept."""
        self._order_key = order_key
        self.bound = bound
        jobs = [job for _, job in self._live.values()]
        self._live.clear()
        self._heap, self._ages, self._expiry = [], [], []
        for job in jobs:
            self.push(job)

    def promotion_due(self) -> float | None:
        """Loop time of the earliest wait deadline (maybe past); None if none or no aging."""
        self._drop_stale_ages()
        return self._ages[0][0] if self._ages else None

    def oldest_promoted(self, now: float) -> Job | None:
        """The promoted job with the earliest deadline, if any job is past its deadline."""
        self._drop_stale_ages()
        if self._ages and self._promoted(self._ages[0], now):
            return self._ages[0][2]
        return None

    def deadline(self, job: Job, times: tuple[float, float] | None = None) -> float:
        """Loop time at which the job is promoted: its total wait reaches its bound, or
        (on time) its slack under its objective runs low; inf for neither."""
        aged = float("inf") if self.bound is None else self.wait_started(job) + self.bound(job)
        if job.overtakes_spent:
            aged = min(aged, self.wait_started(job))  # promoted, in arrival order
        if times is None:
            times = self._slo_times(job)
        return aged if times is None else min(aged, times[0])

    @staticmethod
    def wait_started(job: Job) -> float:
        """Loop time at which the job's total wait would have started, had it been one."""
        return job.enqueue_time - job.waited_s

    # ---- internals -------------------------------------------------------------------------

    def _slo_times(self, job: Job) -> tuple[float, float] | None:
        if self.slo_times is None or not job.on_time:
            return None
        return self.slo_times(job)

    def _add(self, job: Job, times: tuple[float, float] | None) -> int:
        seq = next(self._seq)
        self._live[job.job_id] = (seq, job)
        rank = self.rank(job)
        if self.late_in_place and job.slo_missed and self.slo_times is not None:
            rank, times = rank - 1, self.slo_times(job)  # its place among the on-time jobs
        if rank % 2 == 0 and self.by_slack:  # the on-time tier by latest start; none last
            key = times[1] if times is not None else float("inf")
        else:
            key = self._order_key(job)
        heapq.heappush(self._heap, (rank, key, seq, job))
        return seq

    @staticmethod
    def _promoted(age: _AgeEntry, now: float) -> bool:
        return now >= age[0]

    def _is_live(self, seq: int, job: Job) -> bool:
        current = self._live.get(job.job_id)
        return current is not None and current[0] == seq

    def _take(self, heap: list[_T], n: int, keep: Callable[[_T], bool]) -> list[_T]:
        """Up to n live entries from the top of `heap` while `keep` holds; heap unchanged.
        Both kinds of entry end with (seq, job)."""
        popped: list[_T] = []
        out: list[_T] = []
        while heap and len(out) < n:
            entry = heapq.heappop(heap)
            if not self._is_live(cast(int, entry[-2]), cast(Job, entry[-1])):
                continue
            popped.append(entry)
            if not keep(entry):
                break
            out.append(entry)
        for entry in popped:
            heapq.heappush(heap, entry)
        return out

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap and not self._is_live(heap[0][2], heap[0][3]):
            heapq.heappop(heap)

    def _drop_stale_ages(self) -> None:
        ages = self._ages
        while ages and not self._is_live(ages[0][1], ages[0][2]):
            heapq.heappop(ages)
