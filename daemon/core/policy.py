"""The policy interface. Concrete policies live in policies/ and are found by name there."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from daemon.core.job import Job


class Policy:
    """Decides order, preemption and dispatch size. Stateless about the queues themselves.

    The core owns the waiting and running sets and aging; a policy only answers questions.
    """

    name: ClassVar[str] = ""

    def order_key(self, job: Job) -> float:
        """Rank among waiting jobs of the same priority class; lower runs first.

        Called when a job enters the waiting set; the key is kept until it leaves.
        """
        raise NotImplementedError

    def engine_priority(self, job: Job) -> int:
        """Priority passed to vLLM (lower = kept first under its own memory pressure)."""
        return job.priority

    def token_budget(self, job: Job) -> int | None:
        """Most tokens one dispatch may run before the job returns to the pool; None = all."""
        return None

    def choose_victim(self, candidate: Job, running: Sequence[Job]) -> Job | None:
        """A running job that `candidate` should replace now, or None (no preemption)."""
        return None
