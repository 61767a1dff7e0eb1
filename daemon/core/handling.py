"""How the scheduler core applies each event to its jobs (the base of core/scheduler.py's
Scheduler, which adds the inbox loop, the decision round and shutdown).

A handler changes jobs, the waiting set and the lanes, and marks the core dirty when a
decision round is due; it decides nothing itself (launches and preemptions are the round's,
Scheduler.dispatch). Here too what every path shares: a job queued, stopped, shed or ended.
The state below is the Scheduler's (set in its __init__); only the core's loop calls these.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from daemon.core import decisions, outcomes
from daemon.core.estimates import Estimates
from daemon.core.events import (
    Cancelled,
    Capacity,
    EngineDown,
    EngineFailed,
    EngineUp,
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
from daemon.core.policy import Policy
from daemon.core.ports import LengthPredictor
from daemon.core.refits import Refits
from daemon.core.repredict import Repredictor
from daemon.core.settings import SchedulerConfig
from daemon.core.stream import OutputStream
from daemon.core.waitqueue import WaitQueue


class EventHandling:
    lanes: list[Lane]
    policy: Policy
    config: SchedulerConfig
    estimates: Estimates
    waiting: WaitQueue
    forecast: Forecaster
    repredictor: Repredictor
    refits: Refits
    accepting: bool
    failed: asyncio.Event  # every engine is down for good
    _predictor: LengthPredictor | None
    _ended: asyncio.Queue[Job] | None
    _by_name: dict[str, Lane]
    _jobs: dict[str, Job]  # every job not yet ended
    _streams: dict[str, OutputStream]
    _predicting: dict[str, Job]  # held until their first prediction
    _arriving: dict[str, Job]  # Submitted events in the inbox, not yet handled
    _shedding: set[str]  # named by such an event, to be shed
    _dirty: bool  # something changed since the last decision round
    _idle: asyncio.Event  # no job accepted and not yet ended
    _clock: Callable[[], float]
    _policy_wakeup: float | None

    def now(self) -> float:
        return self._clock()

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

    # ---- stops --------------------------------------------------------------------------

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
        self.forecast.overload.ended(job.finish_time)
        self._streams.pop(job.job_id).finish(reason, error, dropped)
        self.estimates.job_ended(job)
        if self._ended is not None:
            self._ended.put_nowait(job)
        if not self._jobs and not self._arriving:
            self._idle.set()

    def fail_waiting(self, error: str) -> None:
        """No engine can serve any more: stop accepting, end every waiting job with error."""
        self.accepting = False
        for job in [*self._predicting.values(), *self.waiting]:
            self._predicting.pop(job.job_id, None)
            self.waiting.remove(job)
            self._end(job, JobStatus.FAILED, None, error=error)
