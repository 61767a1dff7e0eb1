"""The waiting set: policy order within priority classes, plus aging that bounds every wait."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator

from daemon.core.job import Job

OrderKey = Callable[[Job], float]


class WaitQueue:
    """A heap on (priority class, policy key) and an enqueue-ordered index for aging.

    `pop` is O(log n): a job that has waited `promote_after_s` or longer goes first (oldest
    first), otherwise the heap's best. Removal is lazy: heap entries of jobs that left are
    skipped when they surface.
    """

    def __init__(self, order_key: OrderKey, promote_after_s: float | None) -> None:
        self._order_key = order_key
        self.promote_after_s = promote_after_s  # None disables aging
        self._seq = itertools.count()
        self._heap: list[tuple[int, float, int, Job]] = []
        self._by_age: dict[str, tuple[int, Job]] = {}  # insertion order = enqueue order

    def __len__(self) -> int:
        return len(self._by_age)

    def __contains__(self, job: Job) -> bool:
        return job.job_id in self._by_age

    def __iter__(self) -> Iterator[Job]:
        return (job for _, job in self._by_age.values())

    def push(self, job: Job) -> None:
        seq = next(self._seq)
        self._by_age[job.job_id] = (seq, job)
        heapq.heappush(self._heap, (job.priority, self._order_key(job), seq, job))

    def remove(self, job: Job) -> bool:
        return self._by_age.pop(job.job_id, None) is not None

    def peek(self, now: float) -> Job | None:
        oldest = self.oldest_promoted(now)
        if oldest is not None:
            return oldest
        self._drop_stale()
        return self._heap[0][3] if self._heap else None

    def best(self, now: float, n: int) -> list[Job]:
        """The first n jobs in dispatch order (promoted by age, then the heap); O(n log size)."""
        out: list[Job] = []
        if self.promote_after_s is not None:
            for _, job in self._by_age.values():
                if len(out) >= n or now - job.enqueue_time < self.promote_after_s:
                    break
                out.append(job)
        taken = {job.job_id for job in out}
        popped: list[tuple[int, float, int, Job]] = []
        while self._heap and len(out) < n:
            entry = heapq.heappop(self._heap)
            if self._is_live(entry):
                popped.append(entry)
                if entry[3].job_id not in taken:
                    out.append(entry[3])
        for entry in popped:
            heapq.heappush(self._heap, entry)
        return out

    def update(self, job: Job) -> None:
        """Re-key one waiting job (its prediction changed); its place in age order stays."""
        if job.job_id not in self._by_age:
            return
        seq = next(self._seq)
        self._by_age[job.job_id] = (seq, job)  # same dict slot: enqueue order is kept
        heapq.heappush(self._heap, (job.priority, self._order_key(job), seq, job))

    def promotion_due(self) -> float | None:
        """Loop time at which the oldest waiting job gets promoted; None if no aging or empty."""
        if self.promote_after_s is None or not self._by_age:
            return None
        _, job = next(iter(self._by_age.values()))
        return job.enqueue_time + self.promote_after_s

    def pop(self, now: float) -> Job | None:
        job = self.peek(now)
        if job is not None:
            del self._by_age[job.job_id]
        return job

    def rekey(self, order_key: OrderKey) -> None:
        """Adopt a new policy's order (reload); enqueue order and thus aging is kept."""
        self._order_key = order_key
        self._heap = [(job.priority, order_key(job), seq, job)
                      for seq, job in self._by_age.values()]
        heapq.heapify(self._heap)

    def oldest_promoted(self, now: float) -> Job | None:
        """The longest-waiting job if it has waited promote_after_s or longer."""
        if self.promote_after_s is None or not self._by_age:
            return None
        _, job = next(iter(self._by_age.values()))
        return job if now - job.enqueue_time >= self.promote_after_s else None

    def _is_live(self, entry: tuple[int, float, int, Job]) -> bool:
        current = self._by_age.get(entry[3].job_id)
        return current is not None and current[0] == entry[2]

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap and not self._is_live(heap[0]):
            heapq.heappop(heap)
