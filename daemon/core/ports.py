"""The core's doors as its callers see them: what Scheduler.submit refuses with, and the
first-length predictor the wiring plugs in. (daemon.core.scheduler re-exports them.)"""

from __future__ import annotations

from typing import Protocol

from daemon.core.job import Job, Refusal


class NotAccepting(Exception):
    """The daemon is draining or not ready: 503."""


class QueueFull(Exception):
    """Waiting set at scheduler.max_waiting: 429."""


class SloUnreachable(Exception):
    """The request cannot meet its latency objective even at the front of its class: 429,
    at once, before any engine work."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(f"{refusal.explain()} exceeds the request's objective")
        self.refusal = refusal


class LengthPredictor(Protocol):
    """Makes a job's first length prediction off the loop; the answer comes back into the
    inbox as a Predicted event (daemon.prediction.Predictions is one)."""

    def request(self, job: Job) -> None: ...
