"""Stand-ins the core's tests share."""

from __future__ import annotations

from daemon.core.job import Job


class AskedPredictor:
    """A first-length predictor that only records who asked (the test answers)."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []

    def request(self, job: Job) -> None:
        self.jobs.append(job)
