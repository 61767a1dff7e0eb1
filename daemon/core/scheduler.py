"""The scheduler core: the one owner of every job.

One inbox (an asyncio.Queue of daemon.core.events) and one loop (`run`) that handles each
event in order: a new request, a cancellation, a prediction, an executor's report (a step's
tokens, a dispatch's stop, its engine going down or up), a reload. Only this loop changes a
job, the waiting set (WaitQueue) and the running sets (one Lane per executor), and only it
asks the policy. After the events at hand it runs one decision round when something changed
(or a timer is due: aging's next promotion, a round the policy asked for): launch what fits,
preempt what pays. Decisions leave as commands on the executors' queues.

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
    Stop,
    Stopped,
    Submitted,
    Tokens,
)
from daemon.core.forecast import Forecaster
from daemon.core.job import Job, JobStatus, KVResidency, StopRequest
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


class Scheduler:
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
        self.failed = asyncio.Event()  # every engine is down for good
        self.repredictor = Repredictor(inbox, remaining)
        self.repredictor.timeout_s = policy.repredict_timeout_s
        self.refits = Refits(inbox, fits)
        self._predictor = predictor
        self._ended = ended
        self._by_name = {lane.name: lane for lane in self.lanes}
        self._jobs: dict[str, Job] = {}  # every job not yet ended
        self._streams: dict[str, OutputStream] = {}
        self._predicting: dict[str, Job] = {}  # held until their first prediction
        self._arriving: dict[str, Job] = {}  # Submitted events in the inbox, not yet handled
        self._shedding: set[str] = set()  # named by such an event, to be shed
        self._dirty = False  # something changed since the last decision round
        self._idle = asyncio.Event()
        self._idle.set()
        self._clock = clock or asyncio.get_running_loop().time
        self._policy_wakeup: float | None = None
        self._handlers: dict[type, Callable[[Any], None]] = {
            Tokens: self._on_tokens, Stopped: self._on_stopped, Started: self._on_started,
            Submitted: self._on_submitted, Predicted: self._on_predicted,
            Cancelled: self._on_cancelled, Reconfigured: self._on_reconfigured,
            Refitted: self._on_refitted,
            **dict.fromkeys((EngineDown, EngineUp, Capacity, EngineFailed), self._on_engine)}

    def now(self) -> float:
        return self._clock()

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

    # ---- event handlers -----------------------------------------------------------------

    def _on_submitted(self, event: Submitted) -> None:
        job = event.job
        self._arriving.pop(job.job_id, None)
        if event.shed is not None:
            self._shedding.discard(event.shed)
            victim = self._jobs.get(event.shed)
            if victim is not None and self.waiting.remove(victim):
                self._shed(victim, "evicted-priority", "a more urgent request needed its room")
        self._jobs[job.job_id] = job
        self._streams[job.job_id] = event.stream
        if self._predictor is None or job.predicted_output_tokens is not None:
            # none to ask, or it came with one (a benchmark's, a test's): not predicted again
            event.stream.set_prediction(job.predicted_output_tokens)
            self._first_enqueue(job)
            return
        self._predictor.request(job)
        if (self.policy.uses_predictions and not (job.on_time and self.waiting.by_slack)
                and self._contended(job)):
            self._predicting[job.job_id] = job  # queued when its prediction comes
        else:  # fcfs, by its deadline, or nothing to order it against: the prediction
            self._first_enqueue(job)  # comes while it waits or runs

    def _contended(self, job: Job) -> bool:
        """Whether the job's place in the order matters now: others wait or are being
        predicted, or no lane can start it at once. An uncontended job is not held for its
        prediction (up to predictor.timeout_s), which would only delay its first token."""
        if len(self.waiting) or self._predicting:
            return True
        tokens, context = self.estimates.footprint(job), job.num_context_tokens
        return not any(lane.free_slots > 0 and decisions.admits(
            lane, tokens, context, self.policy, self.estimates.left_tokens, job)
            for lane in self.lanes)

    def _first_enqueue(self, job: Job) -> None:
        if job.first_prediction is None:
            job.first_prediction = job.predicted_output_tokens
        self.forecast.stamp_overtake_budget(job)
        if job.predicted_output_tokens is not None or self._predictor is None:
            self.estimates.observe_arrival(job)  # else when its prediction comes
        self._enqueue(job)

    def _on_predicted(self, event: Predicted) -> None:
        job = self._jobs.get(event.job_id)
        if job is None or job.is_done:
            return
        if not event.revised:
            job.predicted_output_tokens = event.total_tokens
            job.predicted_upper_tokens = event.upper_tokens
            self._streams[job.job_id].set_prediction(event.total_tokens)
            if self._predicting.pop(job.job_id, None) is not None:
                self._first_enqueue(job)
                return
            self.estimates.observe_arrival(job)  # queued before it was predicted
            if job.first_prediction is None:
                job.first_prediction = event.total_tokens
            if job.status is JobStatus.RUNNING and job.checkpoint_tokens is None:
                # launched before its prediction (uncontended): a policy whose checkpoints
                # need one (alise's demotion, isrtf's windows) gets them from now on
                job.checkpoint_tokens = self.policy.next_checkpoint(job)
        self._set_prediction(job, event.total_tokens)

    def _set_prediction(self, job: Job, tokens: float) -> None:
        """A revised prediction: the waiting set re-ranks the job, its lane re-counts it."""
        job.predicted_output_tokens = tokens
        self.waiting.update(job)  # no-op unless it waits
        if job.status is JobStatus.RUNNING:
            lane = self._by_name[job.executor_name or ""]
            lane.work.update(job)
            lane.kv.reserve(job.job_id, self.estimates.footprint(job))
        self._dirty = True

    def _on_cancelled(self, event: Cancelled) -> None:
        job = self._jobs.get(event.job_id)
        if job is None:
            return
        if self._predicting.pop(job.job_id, None) is not None or self.waiting.remove(job):
            self._end(job, JobStatus.ABORTED, "abort")
        elif job.status is JobStatus.RUNNING:
            self._stop(job, StopRequest.ABORT)

    def _on_started(self, event: Started) -> None:
        lane = self._by_name[event.executor]
        job = lane.running.get(event.job_id)
        if job is not None:
            lane.started(job, event.context_tokens, event.cached_tokens)

    def _on_tokens(self, event: Tokens) -> None:
        lane = self._by_name[event.executor]
        if event.kv_usage is not None:
            lane.report(event.kv_usage, event.engine_waiting or 0)
        step: list[tuple[str, int, int]] = []  # (job, context before the step, its tokens)
        for job_id, token_ids in event.items:
            job = lane.running.get(job_id)
            if job is None:
                continue
            step.append((job_id, lane.advance(job, token_ids, event.time), len(token_ids)))
            mark = job.checkpoint_tokens
            if mark is not None and job.num_generated_tokens >= mark:
                self._checkpoint(job)
        if lane.clock.step(event.time, step) and self.refits.due(lane.name, lane.clock):
            self._clock_moved()

    def _on_refitted(self, event: Refitted) -> None:
        if self.refits.adopt(event, self._by_name[event.executor].clock):
            self._clock_moved()

    def _clock_moved(self) -> None:
        if self.estimates.clock_moved():
            self.waiting.rekey(self.policy.order_key, self.estimates.wait_bound())

    def _on_stopped(self, event: Stopped) -> None:
        lane = self._by_name[event.executor]
        job = lane.release(event.job_id)
        if job is None:
            return
        self._dirty = True
        ending = outcomes.of_stop(job, event, lane.stats)
        self.forecast.trace.stop(self.now(), job, ending is not None)
        if ending is None:  # back to wait (preempted, a slice, its engine went down)
            self._enqueue(job)
        else:
            self._end(job, *ending)

    def _on_engine(self, event: EngineDown | EngineUp | Capacity | EngineFailed) -> None:
        """An executor's engine went down, is up again, said what it holds (memory
        admission's limits) or failed for good."""
        self._by_name[event.executor].engine_changed(event, self.config.fixed_running)
        self.estimates.refresh()
        self._dirty = True
        if isinstance(event, EngineFailed) and all(other.failed for other in self.lanes):
            self.fail_waiting(f"no engine is available: {event.why}; the server restarts, "
                              "retry shortly")
            self.failed.set()

    def _on_reconfigured(self, event: Reconfigured) -> None:
        """Live reload: new limits, aging and policy; waiting jobs are re-ranked, none lost."""
        config, policy = event.settings, event.policy
        self.config, self.policy = config, policy
        self.forecast.trace.open(config.trace)
        self.estimates.adopt(policy, config)
        self.repredictor.timeout_s = policy.repredict_timeout_s
        self.waiting.rekey(policy.order_key, self.estimates.wait_bound())
        self._policy_wakeup = None
        for lane in self.lanes:
            for job in lane.running.values():  # running jobs keep going; new checkpoints
                job.checkpoint_tokens = policy.next_checkpoint(job)
        self._dirty = True

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

    def _stop(self, job: Job, why: StopRequest) -> None:
        """Ask the job's executor to stop it; abort beats preempt, each is asked once."""
        if (job.stop_request or 0) >= why:
            return
        job.stop_request = why
        offload = why is StopRequest.PREEMPT and job.kv_residency is KVResidency.OFFLOAD
        self._by_name[job.executor_name or ""].commands.put_nowait(Stop(job.job_id, why, offload))

    # ---- checkpoints --------------------------------------------------------------------

    def _checkpoint(self, job: Job) -> None:
        """A running job reached its checkpoint: the policy updates its estimates."""
        decision = outcomes.at_checkpoint(job, self.policy, self.now())
        if decision is None:
            return
        if decision.predicted_output_tokens is not None:
            self._set_prediction(job, decision.predicted_output_tokens)
        if not outcomes.set_next_checkpoint(job, self.policy):
            return
        if decision.repredict:
            self.repredictor.request(job)
        self._dirty = True

    # ---- job state ----------------------------------------------------------------------

    def _enqueue(self, job: Job) -> None:
        job.status = JobStatus.WAITING
        job.enqueue_time = self.now()
        if job.first_enqueue_time is None:
            job.first_enqueue_time = job.enqueue_time
        self.waiting.push(job)
        self._dirty = True

    def _shed(self, job: Job, dropped: str, why: str) -> None:  # to keep latency objectives
        self._end(job, JobStatus.ABORTED, "shed", f"request dropped: {why}", dropped)

    def _end(self, job: Job, status: JobStatus, reason: str | None,
             error: str | None = None, dropped: str | None = None) -> None:
        job.status = status
        job.finish_time = self.now()
        job.finish_reason = reason
        self._jobs.pop(job.job_id, None)
        self.forecast.promises.forget(job.job_id)  # (started ones were taken back already)
        self._streams.pop(job.job_id).finish(reason, error, dropped)
        self.estimates.job_ended(job)
        if self._ended is not None:
            self._ended.put_nowait(job)
        if not self._jobs and not self._arriving:
            self._idle.set()

    # ---- shutdown -----------------------------------------------------------------------

    async def drain(self, timeout_s: float) -> bool:
        """Stop accepting; wait for every job to end. True if all ended in time."""
        self.accepting = False
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            return False

    def fail_waiting(self, error: str) -> None:
        """No engine can serve any more: stop accepting, end every waiting job with error."""
        self.accepting = False
        for job in [*self._predicting.values(), *self.waiting]:
            self._predicting.pop(job.job_id, None)
            self.waiting.remove(job)
            self._end(job, JobStatus.FAILED, None, error=error)

    async def abort_all(self, timeout_s: float = 10.0) -> None:
        for job_id in list(self._jobs):
            self.cancel(job_id)
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            log.warning("%d jobs did not stop within %.0f s", len(self._jobs), timeout_s)
