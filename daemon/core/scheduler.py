"""The scheduler core: the one owner of every job.

One inbox (an asyncio.Queue of daemon.core.events) and one loop (`run`) that handles each
event in order: a new request, a cancellation, a prediction, an executor's report (a step's
tokens, a dispatch's stop, its engine going down or up), a reload. Only this loop changes a
job, the waiting set (WaitQueue) and the running sets (one Lane per executor), and only it
asks the policy. After the events at hand it runs one decision round when something changed
(or a timer is due: aging's next promotion, a round the policy asked for): launch what fits,
preempt what pays. Decisions leave as commands on the executors' queues. How each event
changes the jobs is core/handling.py's (EventHandling, this class's base).

Pure asyncio: no engine, HTTP, config tree or concrete policy (daemon.service wires it)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any

from daemon.core import decisions, outcomes, slo
from daemon.core.estimates import Estimates
from daemon.core.events import (
    Cancelled,
    Capacity,
    EngineDown,
    EngineFailed,
    EngineUp,
    Event,
    Predicted,
    Reconfigured,
    Refitted,
    Started,
    Stopped,
    Submitted,
    Tokens,
)
from daemon.core.forecast import Forecaster
from daemon.core.handling import EventHandling
from daemon.core.job import Job, StopRequest
from daemon.core.lanes import Lane
from daemon.core.policy import DispatchContext, Policy
from daemon.core.ports import LengthPredictor, NotAccepting
from daemon.core.refits import Refits
from daemon.core.repredict import RemainingPredictor, Repredictor
from daemon.core.settings import SchedulerConfig
from daemon.core.stream import OutputStream
from daemon.core.waitqueue import WaitQueue

log = logging.getLogger(__name__)
_MIN_TIMER_S = 0.001  # a policy asking for a round "now" again must not spin the loop
_EVENTS_PER_TURN = 64  # events handled before the loop serves others


class Scheduler(EventHandling):
    def __init__(self, lanes: Sequence[Lane], policy: Policy, config: SchedulerConfig,
                 inbox: asyncio.Queue[Event], *, predictor: LengthPredictor | None = None,
                 remaining: RemainingPredictor | None = None,
                 ended: asyncio.Queue[Job] | None = None,
                 clock: Callable[[], float] | None = None,
                 fits: Executor | None = None) -> None:
        """lanes: one per executor; inbox: the queue every event comes in by; predictor:
        first predictions (None: jobs get none); remaining: re-predicts running jobs'
        remaining length at policy checkpoints (None: off); ended: every job that ended is
        put there once (metrics, predictor feedback), if given; clock: what now() reads
        (the running loop's time unless a test stops it); fits: the worker the lanes'
        clocks fit in (None: inline; core/refits.py)."""
        self.lanes = list(lanes)
        self.policy = policy
        self.config = config
        self.inbox = inbox
        # Clocks, typical service, calibration, footprints: sets the lanes' admission and
        # the policy's cost model (the configured one is the clocks' prior) and batch.
        self.estimates = Estimates(self.lanes, policy, config)
        self.waiting = WaitQueue(policy.order_key, self.estimates.wait_bound(),
                                 lambda job: slo.times(job, self.policy,
                                                       self.forecast.promote_slack))
        self.forecast = Forecaster(self.waiting, self.lanes, self.estimates, self.now)
        self.forecast.trace.open(config.trace)
        self.accepting = False
        self.failed = asyncio.Event()
        self.repredictor = Repredictor(inbox, remaining)
        self.repredictor.timeout_s = policy.repredict_timeout_s
        self.refits = Refits(inbox, fits)
        self._predictor = predictor
        self._ended = ended
        self._by_name = {lane.name: lane for lane in self.lanes}
        self._jobs = {}  # (each: handling.EventHandling says what it holds)
        self._streams = {}
        self._predicting = {}
        self._arriving = {}
        self._shedding = set()
        self._dirty = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._clock = clock or asyncio.get_running_loop().time
        self._policy_wakeup = None
        self._handlers: dict[type, Callable[[Any], None]] = {
            Tokens: self._on_tokens, Stopped: self._on_stopped, Started: self._on_started,
            Submitted: self._on_submitted, Predicted: self._on_predicted,
            Cancelled: self._on_cancelled, Reconfigured: self._on_reconfigured,
            Refitted: self._on_refitted,
            **dict.fromkeys((EngineDown, EngineUp, Capacity, EngineFailed), self._on_engine)}

    @property
    def num_running(self) -> int:
        return sum(len(lane.running) for lane in self.lanes)

    @property
    def num_jobs(self) -> int:
        """Jobs accepted and not yet ended (in the inbox, predicting, waiting, running)."""
        return len(self._jobs) + len(self._arriving)

    # ---- what the HTTP side calls (it only puts events in the inbox) --------------------

    def submit(self, job: Job, stream: OutputStream) -> None:
        """Accept a job, or refuse it at once (NotAccepting; SloUnreachable, QueueFull:
        Forecaster.admit, which may name a sheddable job to drop for its room)."""
        if not self.accepting:
            raise NotAccepting("server is not accepting requests")
        queued = len(self.waiting) + len(self._predicting) + len(self._arriving)
        shed = self.forecast.admit(job, self._arriving.values(), queued,
                                   self.config.max_waiting, self._shedding)
        self._arriving[job.job_id] = job
        self._idle.clear()
        self.inbox.put_nowait(Submitted(job, stream, shed))

    def cancel(self, job_id: str) -> None:
        """The client went away: end the job wherever it is (no-op once it ended)."""
        self.inbox.put_nowait(Cancelled(job_id))

    def reconfigure(self, config: SchedulerConfig, policy: Policy) -> None:
        """Live reload: takes effect in the loop, in order with every other event."""
        self.inbox.put_nowait(Reconfigured(config, policy))

    # ---- the loop -----------------------------------------------------------------------

    async def run(self) -> None:
        try:
            while True:
                deadline = self._next_deadline()
                event: Event | None = None
                if deadline is None:
                    event = await self.inbox.get()
                else:
                    try:
                        async with asyncio.timeout(max(deadline - self.now(), _MIN_TIMER_S)):
                            event = await self.inbox.get()
                    except TimeoutError:
                        self._dirty = True
                handled = 0
                while event is not None:
                    self.handle(event)
                    handled += 1
                    if handled % _EVENTS_PER_TURN == 0:
                        # one request may bring a thousand jobs: others get the loop between
                        # batches (events keep their order; the round waits for the last)
                        await asyncio.sleep(0)
                    event = self.inbox.get_nowait() if not self.inbox.empty() else None
                if self._dirty:
                    self._dirty = False
                    self.dispatch()
        finally:
            await self.repredictor.close()
            self.forecast.trace.close()

    def handle(self, event: Event) -> None:
        """One event; the caller runs the decision round afterwards (run, or a test)."""
        self._handlers[type(event)](event)

    def _next_deadline(self) -> float | None:
        due = (self.waiting.promotion_due(), self.waiting.expiry_due(), self._policy_wakeup)
        return min((t for t in due if t is not None and t > self.now()), default=None)

    # ---- the decision round -------------------------------------------------------------

    def dispatch(self) -> None:
        """One decision round: launch what fits, preempt what pays, let the policy review."""
        for job in self.waiting.expire(self.now()):  # on-time jobs that became late
            self.forecast.turned_late(job.job_id, self.now())  # its error is known
            if job.slo is not None and job.slo.sheddable and self.waiting.remove(job):
                self._shed(job, "rejected-ttl-expired", "it can no longer meet its objective")
            else:  # it waits on, in place or behind ([slo] late)
                job.slo_missed = True
                self.waiting.update(job)
        self.waiting.order_by_slack(self.forecast.overloaded())  # on-time jobs, in overload
        ctx = DispatchContext(self.now(), self.waiting, self.lanes)
        started: list[tuple[int, float]] = []  # (class, wait start) of each launch
        for job, lane in decisions.launches(ctx, self.policy, self.config.aging.lookahead,
                                            self._by_name, self.estimates.footprint,
                                            self.estimates.left_tokens, self.config.backfill,
                                            self.config.backfill_past_promoted):
            self.waiting.remove(job)
            started.append((job.priority, self.waiting.wait_started(job)))
            self._launch(job, lane)
        if started and self.forecast.counts_overtakes:
            self.waiting.overtaken(started)
        if len(self.waiting):
            self._count_held(ctx)
            for spare in decisions.displaced(ctx, self.lanes):
                spare.kv_residency = None  # nothing cached yet: nothing to keep or offload
                self._stop(spare, StopRequest.PREEMPT)
        if self.config.aging.preempt and len(self.waiting):
            for victim in decisions.for_promoted(ctx, self.policy, self._by_name,
                                                   self.estimates.footprint):
                self._preempt(victim, ctx)
        if self.policy.preemptive and len(self.waiting):
            for victim in decisions.by_policy(ctx, self.policy):
                self._preempt(victim, ctx)
        self._policy_wakeup = self.policy.after_round(ctx)

    def _count_held(self, ctx: DispatchContext) -> None:
        """The next waiting job stays although some lane has a free slot and KV for it now:
        count the rule that held it there (Lane.held, /metrics), so that no hold is silent."""
        head = ctx.waiting.best(ctx.now, 1)
        if not head:
            return
        tokens = self.estimates.footprint(head[0])
        for lane in self.lanes:
            reason = decisions.hold_reason(lane, head[0], tokens, self.policy,
                                           self.estimates.left_tokens)
            if reason is not None:
                lane.held[reason] = lane.held.get(reason, 0) + 1

    def _launch(self, job: Job, lane: Lane) -> None:
        kv_tokens, stream = self.estimates.footprint(job), self._streams[job.job_id]
        lane.commands.put_nowait(decisions.launch(job, lane, self.policy, self.now(), kv_tokens,
                                                  stream))
        self.estimates.launched(kv_tokens)
        self.forecast.promises.started(job.job_id, self.now())
        self.forecast.trace.launch(self.now(), job, lane, len(self.waiting))

    def _preempt(self, job: Job, ctx: DispatchContext) -> None:
        """Stop the job at its next token boundary, with the policy's word on where its KV
        waits (OFFLOAD: its executor saves it to kvstore first)."""
        job.kv_residency = outcomes.residency(job, self.policy, ctx)
        self._stop(job, StopRequest.PREEMPT)

    # ---- shutdown -----------------------------------------------------------------------

    async def drain(self, timeout_s: float) -> bool:
        """Stop accepting; wait for every job to end. True if all ended in time."""
        self.accepting = False
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            return False

    async def abort_all(self, timeout_s: float = 10.0) -> None:
        for job_id in list(self._jobs):
            self.cancel(job_id)
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            log.warning("%d jobs did not stop within %.0f s", len(self._jobs), timeout_s)
