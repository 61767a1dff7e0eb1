"""Pieces several policies share: the parameter-section base and its field constraints,
class-aware victim choice."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from daemon.core.job import Job
from daemon.core.settings import BENCH_KNOB

__all__ = ["BENCH_KNOB", "NonNegative", "Params", "Positive", "pick_victim", "true_remaining"]

NonNegative = msgspec.Meta(ge=0)
Positive = msgspec.Meta(gt=0)


class Params(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A policy's own `[policies.NAME]` section. daemon.config collects every policy's type
    through the registry, so a policy needs nothing from the daemon's config to define it.
    Constraints are declared on the fields (`msgspec.Meta`); the papers' tuning constants
    are marked BENCH_KNOB (experiments set them, an operator's file may not)."""


Measure = Callable[[Job], float]  # bigger = more work left = better victim
Beats = Callable[[Job, Job], bool]  # (candidate, victim) -> preempting pays


def pick_victim(candidate: Job, running: Sequence[Job], measure: Measure,
                beats: Beats) -> Job | None:
    """The running job a waiting candidate should replace, or None.

    Request classes first (lower `priority` = more urgent, as vLLM): a candidate replaces a
    job of a less urgent class outright, never one of a more urgent class. Within its own
    class it replaces the job with the most work left, and only if `beats` says so.
    """
    worst: Job | None = None
    worst_key: tuple[int, float] | None = None
    for job in running:
        if job.priority < candidate.priority:
            continue
        key = (job.priority, measure(job))
        if worst_key is None or key > worst_key:
            worst, worst_key = job, key
    if worst is None:
        return None
    if worst.priority > candidate.priority or beats(candidate, worst):
        return worst
    return None


def true_remaining(job: Job) -> float:
    """Tokens the job will still generate, as oracle policies see it: the true length when
    the caller knows it (simulator), else the token budget. Benchmarks force every output
    length (`ignore_eos` + `max_tokens`), so over HTTP the budget *is* the truth; with
    natural stops it is only an upper bound, and the oracle is no oracle."""
    budget = job.num_remaining_budget_tokens
    if job.true_output_tokens is None:
        return float(max(budget, 1))
    return float(min(max(job.true_output_tokens - job.num_generated_tokens, 1), budget))
