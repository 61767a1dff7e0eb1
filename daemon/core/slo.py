"""Latency objectives in the core: when a job must start to meet its objective, when a new
request would get its first token, and whether it met its objective in the end.

A job with an objective (job.slo: first token within ttft_s of arrival, then tpot_s per
token) waits ahead of best-effort jobs of its class while it can still make it (WaitQueue's
tier), in the policy's order, and is promoted (goes first, earliest deadline first) when its
slack runs low: PROMOTE_SLACK of its TTFT budget before its latest start. At its latest start
it is late: a sheddable job is dropped, any other waits on (slo_missed): by default in its
place among the on-time jobs of its class, or behind them as best effort ([slo] late).

Every figure is in the learned clock's seconds (the policy's cost model), with the jobs'
predicted lengths: a new request's first token is forecast by list-scheduling the jobs that
go before it on every slot, running jobs' predicted remaining service first (as the aging
guard does, core/guard.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from daemon.core.guard import list_starts
from daemon.core.job import Job, Refusal
from daemon.core.lanes import Lane
from daemon.core.policy import Policy

Left = Callable[[Job], float]  # a running job's output tokens still to come

PROMOTE_SLACK = 0.25  # share of its TTFT budget a job has left when it is promoted
MAX_AHEAD = 512  # jobs ahead a forecast list-schedules (the rest count at the typical time)


class Prediction(NamedTuple):
    ttft_s: float  # predicted seconds from arrival to the first token
    finish_s: float  # ... to the last token


def latest_start(job: Job, policy: Policy) -> float | None:
    """Loop time by which the job must (re)start to meet its objective; None = no bound.
    Before its first token: its TTFT deadline less its prefill. After (a preempted job):
    when the rest of its answer, at the predicted length, would break its TPOT budget."""
    slo = job.slo
    if slo is None:
        return None
    if job.first_token_time is None:
        if slo.ttft_s is None:
            return None
        return job.arrival_time + slo.ttft_s - policy.cost.prefill_s(job.num_prompt_tokens)
    if slo.tpot_s is None:
        return None
    total = job.num_generated_tokens + policy.remaining_tokens(job)
    return job.first_token_time + slo.tpot_s * max(total - 1, 0) - policy.service_s(job)


def times(job: Job, policy: Policy, slack: float = PROMOTE_SLACK
          ) -> tuple[float, float] | None:
    """(promotion time, latest start) of a job with a bound on its start (WaitQueue's
    SloTimes): it goes ahead of the policy's order `slack` of its TTFT budget before it
    must start ([slo] promote_slack)."""
    latest = latest_start(job, policy)
    if latest is None:
        return None
    budget = job.slo.ttft_s if job.slo is not None and job.slo.ttft_s is not None else 0.0
    return latest - slack * budget, latest


def slot_free_times(lanes: Iterable[Lane], policy: Policy, slots_of: dict[str, int],
                    left: Left) -> list[float]:
    """Seconds from now until each slot of the serving lanes frees: a lane with `slots`
    slots and n running jobs frees one at each of its running jobs' predicted ends, and
    has slots - n free now (none while n >= slots, until n - slots + 1 of them ended)."""
    free: list[float] = []
    for lane in lanes:
        if lane.failed:
            continue
        slots = slots_of[lane.name]
        ends = sorted(running_left_s(job, policy, slots, left) for job in lane.running.values())
        free += [0.0] * max(slots - len(ends), 0) + ends[max(len(ends) - slots, 0):]
    return free


def running_left_s(job: Job, policy: Policy, batch: int, left: Left) -> float:
    """A running job's predicted seconds to its last token (`left`: its tokens still to
    come, Estimates.left_tokens), in a batch of `batch`."""
    context = job.num_context_tokens
    return policy.cost.wall_s(0, context, left(job), batch)


def running_ends(lane: Lane, policy: Policy, left: Left) -> list[tuple[float, str]]:
    """(seconds to its last token, job id) of each of the lane's running jobs, soonest first
    (admission.seconds_until_fits reads them)."""
    return sorted((running_left_s(job, policy, policy.batch_hint, left), job.job_id)
                  for job in lane.running.values())


def start_in(free: Sequence[float], services: Iterable[float]) -> float:
    """Seconds until a slot frees for a job that starts after jobs of `services` seconds,
    each started on the earliest free slot in turn; inf with no slot."""
    if not free:
        return math.inf
    return list_starts(list(free), [*services, 0.0])[-1]


def refusal(job: Job, start_s: float, policy: Policy, decode_step_s: float) -> Refusal | None:
    """Why `job` cannot meet its objective if it starts `start_s` seconds after its arrival
    and then decodes at `decode_step_s` per token; None when it can."""
    slo = job.slo
    if slo is None:
        return None
    if slo.ttft_s is not None:
        ttft = start_s + policy.cost.prefill_s(job.num_prompt_tokens)
        if ttft > slo.ttft_s:
            return Refusal("ttft", ttft, ttft - slo.ttft_s)
    if slo.tpot_s is not None and decode_step_s > slo.tpot_s:
        return Refusal("tpot", decode_step_s, 0.0)
    return None


class Attainment(NamedTuple):
    """An ended job against its objective: slack (s; negative = missed) of each part."""

    ttft_slack_s: float | None
    tpot_slack_s: float | None

    @property
    def met(self) -> bool:
        return all(s is None or s >= 0 for s in (self.ttft_slack_s, self.tpot_slack_s))


def attainment(job: Job) -> Attainment | None:
    """How a finished job did against its objective; None without one or without a token."""
    slo, first = job.slo, job.first_token_time
    if slo is None or first is None or job.finish_time is None:
        return None
    ttft = None if slo.ttft_s is None else slo.ttft_s - (first - job.arrival_time)
    tpot = None
    if slo.tpot_s is not None and job.num_generated_tokens > 1:
        tpot = slo.tpot_s - (job.finish_time - first) / (job.num_generated_tokens - 1)
    return Attainment(ttft, tpot)
