"""EPP-style routing in the simulator: one lengthwise daemon per executor (each its own
core, queue and policy) behind a router that places every request as it arrives, by a score
of each daemon's metrics, as llm-d's endpoint picker does in front of model-server pods.

Scores: least_queue (waiting + running requests: `vllm:num_requests_waiting` +
`vllm:num_requests_running`, the EPP's default queue scorer), predicted (predicted
outstanding output tokens, running + waiting: `lengthwise_predicted_outstanding_tokens`,
fewer requests on a tie), round_robin.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from daemon.core.job import Job
from daemon.core.scheduler import Scheduler

Route = Callable[[Job], Scheduler]
ROUTERS = ("least_queue", "predicted", "round_robin")


def queue_length(sched: Scheduler) -> int:
    """Jobs accepted and not ended: waiting, running, or still in the core's inbox."""
    return sched.num_jobs


def outstanding_tokens(sched: Scheduler) -> float:
    waiting = sum(job.predicted_remaining_tokens for job in sched.waiting)
    return waiting + sum(lane.load() for lane in sched.lanes)


def make_route(name: str, daemons: Sequence[Scheduler]) -> Route:
    """'' routes everything to the one daemon (no router)."""
    if not name:
        return lambda _: daemons[0]
    if name == "least_queue":
        return lambda _: min(daemons, key=queue_length)
    if name == "predicted":
        return lambda _: min(daemons, key=lambda d: (outstanding_tokens(d), queue_length(d)))
    if name == "round_robin":
        turn = itertools.cycle(daemons)
        return lambda _: next(turn)
    raise ValueError(f"unknown router {name!r}: {' | '.join(ROUTERS)}")
