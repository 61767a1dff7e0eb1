"""The policy interface. Concrete policies live in policies/ and are found by name there."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple, Protocol

import msgspec

from daemon.core.costmodel import CostModel
from daemon.core.job import Job, KVResidency
from daemon.core.waitqueue import WaitQueue


class ExecutorView(Protocol):
    """What a policy may read about an executor (daemon.executors.base.Executor is one)."""

    name: str
    max_running: int
    running: dict[str, Job]

    @property
    def free_slots(self) -> int: ...

    def load(self) -> float: ...  # predicted remaining tokens of its running jobs

    # Context tokens their predicted remaining decode steps read (daemon.core.work).
    def context_reads(self) -> float: ...


# Picks one of the executors with a free slot for a job (daemon.core.placement).
Placement = Callable[[Job, Sequence[ExecutorView]], ExecutorView]


@dataclass(slots=True, frozen=True)
class DispatchContext:
    """One decision round as a policy sees it. Read-only for policies: the core moves jobs."""

    now: float  # loop clock, seconds
    waiting: WaitQueue
    executors: Sequence[ExecutorView]

    def free_executors(self) -> list[ExecutorView]:
        return [ex for ex in self.executors if ex.free_slots > 0]

    def running_jobs(self) -> list[Job]:
        return [job for ex in self.executors for job in ex.running.values()]


class Checkpoint(NamedTuple):
    """A policy's word on a running job at its checkpoint."""

    repredict: bool = False  # re-predict its remaining length (off the loop)
    predicted_output_tokens: float | None = None  # a revised prediction (None: unchanged)


class Policy:
    """Decides order, preemption and dispatch size; the core owns the sets and aging.

    A policy may keep advisory state (a plan, estimates), but the core's waiting and running
    sets are the truth: any job in that state may have left, and a policy must cope with it.
    Hooks run on the event loop at every decision: keep them cheap (no I/O, no models).
    """

    name: ClassVar[str] = ""
    # Whether choose_victim can ever return a job; the core skips the question otherwise.
    preemptive: ClassVar[bool] = False
    # Whether order or dispatch reads job predictions. If not, a job is queued at once and
    # its prediction (for headers and metrics) is made while it waits or runs.
    uses_predictions: ClassVar[bool] = True
    # Whether the core's aging applies. FCFS's own order already bounds every wait (the
    # oldest goes first), and aging would only make it something other than the baseline.
    aged: ClassVar[bool] = True
    # Most preemptions one job may suffer; the core never offers a job at the bound as a
    # victim. None = unbounded.
    max_preemptions: int | None = None
    # Seconds one batch of re-predictions (see on_checkpoint) may take.
    repredict_timeout_s: float = 1.0
    # The policy's own [policies.NAME] section (a Struct type it defines) and that NAME;
    # None for a policy without parameters. Subclasses may share one (oracle-srpt: isrtf's).
    params_type: ClassVar[type[msgspec.Struct] | None] = None
    params_section: ClassVar[str] = ""
    # The engine's cost model and how many jobs decode together at load (max_running);
    # __init__ sets both (daemon.policysetup from the config).
    cost: CostModel = CostModel()
    batch_hint: int = 4
    # Factor the core learned between predicted and actual lengths (core/calibration.py),
    # and whether a request's budget caps its prediction ([scheduler] trust_budget).
    length_scale: float = 1.0
    trust_budget: bool = True
    # [scheduler] placement other than "predicted" (daemon.policysetup sets it); None:
    # own_executor.
    placement: Placement | None = None
    engine_order = "launch"  # vllm_priority; set by the core (scheduler.engine_order)

    def __init__(self, params: msgspec.Struct | None = None, cost: CostModel | None = None,
                 max_running: int = 4) -> None:
        """params: an instance of params_type (None: its defaults); cost: the engine's cost
        model (None: the generic one); max_running: jobs decoding together at load."""
        self.cost = cost or CostModel()
        self.batch_hint = max_running

    def remaining_tokens(self, job: Job) -> float:
        """Output tokens the job is expected to still generate, as this policy sees it."""
        return job.predicted_remaining(self.length_scale, self.trust_budget)

    def service_s(self, job: Job, remaining: float | None = None) -> float:
        """Predicted seconds the job needs from its next launch, in a full batch: the
        prefill of its context, then its remaining decode steps (`remaining` output tokens;
        None: remaining_tokens). The core bounds each job's wait relative to this (the same
        value whether it runs or waits, so a deadline only moves with a new prediction)."""
        context = job.num_context_tokens
        rest = self.remaining_tokens(job) if remaining is None else remaining
        return self.cost.wall_s(context, context, rest, self.batch_hint)

    def own_wait_s(self, job: Job) -> float:
        """Seconds of wait the policy itself may add to this job, on top of the core's
        uniform bound (slowdown x the typical service): its aging bound is the sum. 0 for
        most; blend: beta x the job's own service, so its bound is relative to the job."""
        return 0.0

    def order_key(self, job: Job) -> float:
        """Rank among waiting jobs of the same priority class; lower runs first.

        Called when a job enters the waiting set; the key is kept until it leaves (or its
        prediction changes).
        """
        raise NotImplementedError

    def engine_priority(self, job: Job) -> int:
        """Priority passed to vLLM (lower = kept first under its own memory pressure)."""
        return job.priority

    def vllm_priority(self, job: Job) -> int:
        """What the core hands vLLM (scheduler.engine_order): "policy", engine_priority;
        "arrival", the job's class, then its arrival: a full cache preempts the latest
        arrival; "launch", the class only: vLLM breaks the tie by its request's own
        arrival, this launch, so a full cache preempts the job started last (whose
        recompute is mostly the cheapest), as vLLM's own FCFS does."""
        if self.engine_order == "arrival":
            return class_rank(job.priority, job.arrival_time * 1000.0, MS_RANK_SCALE)
        if self.engine_order == "launch":
            return class_rank(job.priority, 0.0)
        return self.engine_priority(job)

    def token_budget(self, job: Job) -> int | None:
        """Most tokens one dispatch may run before the job returns to the pool; None = all."""
        return None

    def choose_victim(self, candidate: Job, running: Sequence[Job], now: float) -> Job | None:
        """A running job that `candidate` should replace now, or None (no preemption).

        `running` holds only jobs that may still be preempted (not stopping, under the bound).
        """
        return None

    def preempt_residency(self, job: Job, ctx: DispatchContext) -> KVResidency:
        """Where the KV of `job`, about to be preempted, waits for its resume; the executor
        acts on it at the abort (OFFLOAD: saved to kvstore where the engine has one).
        Default: KEEP, left in the engine's prefix cache."""
        return KVResidency.KEEP

    def choose_executor(self, job: Job, free: Sequence[ExecutorView]) -> ExecutorView:
        """Where a job goes among executors with a free slot: the configured placement, or
        else the policy's own (own_executor)."""
        if self.placement is not None:
            return self.placement(job, free)
        return self.own_executor(job, free)

    def own_executor(self, job: Job, free: Sequence[ExecutorView]) -> ExecutorView:
        """The policy's placement: least predicted outstanding work (sum of predicted
        remaining tokens, which each executor keeps as a running total), fewer running
        jobs on a tie."""
        return min(free, key=lambda ex: (ex.load(), len(ex.running)))

    def next_assignment(self, ctx: DispatchContext) -> tuple[Job, ExecutorView] | None:
        """The next (waiting job, executor with a free slot) to launch, or None to stop.

        The core launches it and asks again. Jobs promoted by aging never reach this: the
        core launches them first, whatever the policy.
        """
        free = ctx.free_executors()
        job = ctx.waiting.peek(ctx.now) if free else None
        if job is None:
            return None
        return job, self.choose_executor(job, free)

    def next_checkpoint(self, job: Job) -> int | None:
        """num_generated_tokens at which on_checkpoint should run for this running job."""
        return None

    def on_checkpoint(self, job: Job, now: float) -> Checkpoint:
        """A running job reached its checkpoint: a revised prediction, and whether the core
        should re-predict its remaining length (off the loop, with a predictor)."""
        return Checkpoint()

    def after_round(self, ctx: DispatchContext) -> float | None:
        """End of a decision round: refresh derived state. Returns the loop time of the
        next round the policy wants even if no event comes (None = only on events)."""
        return None


# A time-like value in ms within a class (class_rank's scale): room for ~300 years of the
# event loop's clock.
MS_RANK_SCALE = 10**13


def class_rank(priority: int, value: float, scale: int = 1_000_000) -> int:
    """vLLM priority that keeps request classes apart and orders by `value` within one."""
    return priority * scale + min(max(int(value), 0), scale - 1)
