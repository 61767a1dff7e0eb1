"""The waiting set: policy order within priority classes, plus aging that bounds every wait."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from typing import TypeVar, cast

from daemon.core.job import Job

OrderKey = Callable[[Job], float]
_Entry = tuple[int, float, int, Job]  # (priority class, policy key, seq, job)
_AgeEntry = tuple[float, int, Job]  # (when its wait clock started, seq, job)
_T = TypeVar("_T", _Entry, _AgeEntry)


class WaitQueue:
    """A heap on (priority class, policy key) and a heap on total waiting time, for aging.

    Aging counts a job's *total* wait: every interval it spent here, across preemptions and
    slices, so a job that keeps being sent back cannot dodge promotion. A job whose total
    wait reaches `promote_after_s` goes ahead of every non-promoted job, the longest wait
    first; otherwise the policy heap's best goes. While a job waits, its wait clock started
    at `enqueue_time - waited_s`, a fixed key: the age heap is never re-keyed.

    `pop` is O(log n). Removal is lazy: entries of jobs that left (or were re-keyed, which
    gives them a new seq) are skipped when they surface.
    """

    def __init__(self, order_key: OrderKey, promote_after_s: float | None) -> None:
        self._order_key = order_key
        self.promote_after_s = promote_after_s  # None disables aging
        self._seq = itertools.count()
        self._heap: list[_Entry] = []
        self._ages: list[_AgeEntry] = []
        self._live: dict[str, tuple[int, Job]] = {}  # job id -> (current seq, job)

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, job: Job) -> bool:
        return job.job_id in self._live

    def __iter__(self) -> Iterator[Job]:
        return (job for _, job in self._live.values())

    def push(self, job: Job) -> None:
        self._add(job)
        heapq.heappush(self._ages, (self.wait_started(job), self._live[job.job_id][0], job))

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
        out = [age[2] for age in self._take(self._ages, n, lambda e: self._promoted(e, now))]
        taken = {job.job_id for job in out}
        for entry in self._take(self._heap, n, lambda e: True):
            if len(out) < n and entry[3].job_id not in taken:
                out.append(entry[3])
        return out

    def keyed(self) -> list[tuple[int, float, Job]]:
        """(class, policy key, job) of every waiting job, in no particular order; O(n)."""
        live = self._live  # inlined liveness test: this runs over thousands of entries
        return [(prio, key, job) for prio, key, seq, job in self._heap
                if (entry := live.get(job.job_id)) is not None and entry[0] == seq]

    def update(self, job: Job) -> None:
        """Re-key one waiting job (its prediction changed); its total wait is kept."""
        if job.job_id in self._live:
            self.push(job)

    def rekey(self, order_key: OrderKey) -> None:
        """Adopt a new policy's order (reload); total waits and thus aging are kept."""
        self._order_key = order_key
        self._heap = [(job.priority, order_key(job), seq, job)
                      for seq, job in self._live.values()]
        heapq.heapify(self._heap)

    def promotion_due(self) -> float | None:
        """Loop time at which the longest-waiting job is (or was) promoted; None if no aging."""
        self._drop_stale_ages()
        if self.promote_after_s is None or not self._ages:
            return None
        return self._ages[0][0] + self.promote_after_s

    def oldest_promoted(self, now: float) -> Job | None:
        """The job with the longest total wait, if that wait is promote_after_s or more."""
        self._drop_stale_ages()
        if self._ages and self._promoted(self._ages[0], now):
            return self._ages[0][2]
        return None

    @staticmethod
    def wait_started(job: Job) -> float:
        """Loop time at which the job's total wait would have started, had it been one."""
        return job.enqueue_time - job.waited_s

    # ---- internals -------------------------------------------------------------------------

    def _add(self, job: Job) -> None:
        seq = next(self._seq)
        self._live[job.job_id] = (seq, job)
        heapq.heappush(self._heap, (job.priority, self._order_key(job), seq, job))

    def _promoted(self, age: _AgeEntry, now: float) -> bool:
        return self.promote_after_s is not None and now - age[0] >= self.promote_after_s

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
