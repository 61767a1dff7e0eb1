"""Counters the scheduler keeps, read by /metrics at scrape time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ExecutorStats:
    """Counters per executor."""

    jobs_started: int = 0  # dispatches, resumes included
    jobs_finished: int = 0
    jobs_aborted: int = 0
    jobs_failed: int = 0
    preemptions: int = 0
    budget_yields: int = 0  # dispatches that ran out of their token budget (slices)
    tokens_generated: int = 0
