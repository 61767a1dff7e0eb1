"""Forecasts of when work will start and end, for admission under latency objectives, the
predicted-latency response headers and the per-executor predicted TTFT a router reads.

Admission learns its own error: each job with a TTFT objective accepted in overload is
promised a start some forecast wait from now, and the start's real wait over the forecast
one is a sample (core/promises.py). A refusal must be right (the issue-39 target: >= 90 %
of the refused would have missed), so admission refuses only a job that misses even if it
starts as early, relative to its forecast, as the `refuse_quantile` percentile ([slo]
refuse_quantile, a benchmark knob; the median) of the recent samples, and nothing on a
forecast with fewer than MIN_ERRORS such samples (cold: half the refusals made on it at
face value were wrong). Where every lane admits by the KV
held now (work-conserving memory admission), one forecast plays that admission forward: the
jobs ahead start as their contexts find room and end at their predicted service
(admission.seconds_until_started). Elsewhere the errors are learned apart for waits bound by
the work ahead (slots of typical footprint) and waits bound by the KV fitting (until the
job's context finds room, or under peak admission its projected peak fits). A forecast of
the queue refuses, and is learned, only in overload (overload.py), when the queue orders
on-time jobs by slack as it forecasts. Before, admission took the 95th percentile (never
below 1; 2 when cold), and refused requests that would have met their objective: at 0.2x
memory-bound, 10 of 10 that shadow mode marked met; at 0.5x 50 of 70
(docs/results/2026-11-28-refusal-precision-and-aging.md).

The error is relative because it grows with the work forecast ahead (each job's predicted
service errs); and a job that would start now (a free slot, its KV fits) is never refused,
so that a ratio learned in a bad spell cannot refuse everything while the engine idles; such
a job is promised nothing either (the ratio is learned from the forecasts it applies to).
The horizon (ERROR_HORIZON_S) lets a ratio lapse.

Read-only over the core's state (the waiting set, the lanes, the estimates): called from
the core's loop and from the HTTP handlers on the same event loop, it changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from daemon.core import admission, decisions, slo
from daemon.core.estimates import Estimates
from daemon.core.job import Job, Refusal
from daemon.core.lanes import Lane
from daemon.core.overload import Overload
from daemon.core.ports import QueueFull, SloUnreachable
from daemon.core.promises import COLD_RATIO, RATIO_FLOOR_S, Promises
from daemon.core.trace import Trace
from daemon.core.waitqueue import WaitQueue

MEMORY_AHEAD = 64  # jobs ahead the KV-fit bound places (the slot forecast counts them all)


class Wait(NamedTuple):
    """A new job's forecast wait: until the jobs ahead of it have started (the slot
    forecast) and until its KV fits beside them (the memory bound)."""

    queue_s: float
    memory_s: float

    @property
    def s(self) -> float:
        return max(self.queue_s, self.memory_s)

    @property
    def memory(self) -> bool:
        """The memory bound is the later one."""
        return self.memory_s > self.queue_s


class Forecaster:
    def __init__(self, waiting: WaitQueue, lanes: Sequence[Lane], estimates: Estimates,
                 now: Callable[[], float]) -> None:
        self.waiting = waiting
        self.lanes = lanes
        self.estimates = estimates
        self.now = now
        # Refuse what cannot meet its objective ([slo] enforce); False: shadow mode, where
        # such a job is served and marked (Job.would_refuse) so that its outcome is counted.
        self.enforce = True
        # Percentile of the start errors (real / forecast wait) admission refuses on
        # ([slo] refuse_quantile): a refused job misses even at a start this early.
        self.refuse_quantile = 50.0
        # A forecast refuses only a first token predicted past this x the objective
        # ([slo] refuse_overshoot).
        self.refuse_overshoot = 1.0
        # Share of its TTFT budget an on-time job has left when it is promoted ahead of the
        # policy's order ([slo] promote_slack; slo.times).
        self.promote_slack = slo.PROMOTE_SLACK
        self.overload = Overload()  # whether a forecast of the queue may refuse at all
        self.promises = Promises()  # the starts promised, and how they came true
        self.trace = Trace()  # each forecast at admission, for replay ([scheduler] trace)

    def _service_s(self, job: Job) -> float:
        """A job's predicted service; the typical one while it has no prediction yet."""
        policy = self.estimates.policy
        if job.predicted_output_tokens is None and self.estimates.typical_service_s > 0:
            return self.estimates.typical_service_s
        return policy.service_s(job)

    def _start_in(self, ahead: Iterable[Job], lanes: Sequence[Lane] | None = None) -> float:
        """Seconds until a job queued behind `ahead` would start (list scheduling)."""
        serving = [lane for lane in (lanes or self.lanes) if lane.down_reason is None]
        slots = {lane.name: self.estimates.slots(lane) for lane in serving}
        free = slo.slot_free_times(serving, self.estimates.policy, slots,
                                   self.estimates.left_tokens)
        jobs = list(ahead)
        services = [self._service_s(job) for job in jobs[:slo.MAX_AHEAD]]
        # Beyond MAX_AHEAD, jobs count at the typical service, spread over the slots.
        rest = max(len(jobs) - slo.MAX_AHEAD, 0) * self.estimates.typical_service_s
        return slo.start_in(free, services) + rest / max(len(free), 1)

    @property
    def counts_overtakes(self) -> bool:
        """Aging bounds places (AgingConfig.overtaking) under the current settings and
        policy; not for fcfs, whose order is its own bound."""
        aging = self.estimates.config.aging
        return (aging.overtaking and aging.enabled and aging.slowdown > 0
                and self.estimates.policy.aged)

    def stamp_overtake_budget(self, job: Job) -> None:
        """Where overtakes are counted, give an arriving job its budget of later arrivals
        that may start before it: slowdown x the jobs running together (now, or as many as
        the lanes' memory holds, whichever is more), plus, with overtake_base = "place",
        the jobs waiting ahead of it (its place in FCFS's line). WaitQueue.overtaken counts
        them."""
        if job.overtake_budget is not None or not self.counts_overtakes:
            return
        aging = self.estimates.config.aging
        together = max(sum(len(lane.running) for lane in self.lanes),
                       sum(self.estimates.slots(lane) for lane in self.lanes if not lane.failed))
        if aging.overtake_base == "place":
            together += len(self.waiting)
        job.overtake_budget = max(round(aging.slowdown * together), 1)

    def ahead_of(self, job: Job, pending: Iterable[Job] = ()) -> list[Job]:
        """Jobs that go before a new `job` with an objective, in order: waiting ones of a more
        urgent rank, on-time ones of its rank that must start earlier (by slack, in overload;
        below it all: an unpredicted job has no place in the policy's order), promoted ones;
        then the `pending` (arrived, not yet queued) of its class or a more urgent one."""
        waiting, now = self.waiting, self.now()
        latest = slo.latest_start(job, self.estimates.policy) if waiting.by_slack else None
        mine = (WaitQueue.rank(job), latest or math.inf)
        ahead = sorted((((rank, key), other) for rank, key, other in waiting.keyed()
                        if (rank, key) <= mine or waiting.deadline(other) <= now),
                       key=lambda entry: entry[0])
        return [other for _, other in ahead] + [
            other for other in pending if other.priority <= job.priority]

    def admit(self, job: Job, pending: Iterable[Job], queued: int, max_waiting: int,
              shedding: set[str]) -> str | None:
        """Admission of a new job with `queued` jobs not yet running (`pending` of them not
        yet queued) and `shedding` ids already named to be shed: SloUnreachable when it
        cannot meet its objective; QueueFull at max_waiting unless a sheddable job of a
        less urgent class gives up its room (its id is returned and added to `shedding`)."""
        wait, memory = 0.0, False
        self.overload.arrived(self.now())
        if job.on_time:
            ahead = self.ahead_of(job, pending)
            behind = self._wait_behind(job, ahead)
            wait, memory = behind.s, behind.memory
            refusal = self._refusal(job, behind, len(ahead))
            if self.trace.on:
                self._trace(job, ahead, behind, refusal)
                if refusal is not None:
                    self._trace_refusal(job, refusal, probe=False)
            if refusal is not None and refusal.forecast != "none":
                self.overload.refused(self.now())  # the overload goes on
            if refusal is not None and self.enforce:
                raise SloUnreachable(refusal)
            if refusal is not None:  # shadow mode: served, and its outcome counted
                job.would_refuse = refusal
        victim = None
        if queued - len(shedding) >= max_waiting:
            victim = self.waiting.sheddable_for(job, shedding)
            if victim is None:
                raise QueueFull(f"{queued} requests are already waiting")
            shedding.add(victim.job_id)
        if (wait and math.isfinite(wait) and job.slo is not None and job.slo.ttft_s is not None
                and self.waiting.by_slack):
            # accepted to wait, in the forecast's order (by_slack): its promise, no margin
            self.promises.promise(job.job_id, self.now(), wait, memory)
        return None if victim is None else victim.job_id

    def _trace(self, job: Job, ahead: Sequence[Job], wait: Wait,
               refusal: Refusal | None) -> None:
        policy, left = self.estimates.policy, self.estimates.left_tokens
        self.trace.admission(
            self.now(), job, wait, [(other, self._service_s(other)) for other in ahead],
            self.lanes, lambda lane: slo.running_ends(lane, policy, left), left,
            self.decode_step_s(), refusal, slo.latest_start(job, policy))

    def refusal(self, job: Job, pending: Iterable[Job] = ()) -> Refusal | None:
        """Why a new job cannot meet its objective even at the front of its class (the jobs
        `ahead_of` it still go first; the time since its arrival counts); None when it can,
        or it has none."""
        if job.slo is None:
            return None
        ahead = self.ahead_of(job, pending)
        refusal = self._refusal(job, self._wait_behind(job, ahead), len(ahead))
        if refusal is not None:
            self.overload.arrived(self.now())  # refused here, it never reaches admit
            if self.trace.on:
                self._trace_refusal(job, refusal, probe=True)
        return refusal

    def _trace_refusal(self, job: Job, refusal: Refusal, probe: bool) -> None:
        now = self.now()
        self.trace.refused(now, job, refusal, probe, self.overload.late_jobs(now),
                           self.overload.inflow_ratio(now))

    def _refusal(self, job: Job, wait: Wait, ahead: int) -> Refusal | None:
        """Why `job`, forecast to start after `wait` (with `ahead` jobs before it), cannot
        meet its objective. A forecast refuses only once its error is learned
        (margin()): cold, it erred either way, and half the refusals made on it were wrong
        (48 refusals, 25 missed, in four shadow runs at 0.5x and 0.8x; learned, 198 of 210
        missed). Under work-conserving admission a wait with nothing queued ahead (the
        memory's alone) refuses nothing: the engine starts a job once its context fits now
        and makes room by preemption, so when that happens hangs on single running jobs'
        ends. In shadow mode at 0.6-1.2x, 16 of the 39 requests the memory bound would have
        refused missed their objective (41 %); at 0.6x every refusal was its
        (docs/results/2026-11-29-refusal-causes.md); with none ahead, 15 of 15 would-be
        refusals at 0.2x met their objective. Figures before:
        docs/results/2026-11-28-cold-forecasts.md."""
        early = wait.memory and any(lane.work_conserving for lane in self.lanes)
        if early and not ahead:
            seconds, memory = 0.0, False
        elif early:
            seconds, memory = wait.queue_s, False
        else:
            seconds, memory = wait.s, wait.memory
        if not self.learned(memory) or not self.overload.refusing(self.now()):
            seconds = 0.0
        margin = self.margin(memory) if seconds else COLD_RATIO
        waited = self.now() - job.arrival_time
        start_s = waited + max(seconds, RATIO_FLOOR_S) * margin if seconds else waited
        refusal = slo.refusal(job, start_s, self.estimates.policy, self.decode_step_s())
        if refusal is None or not seconds:
            return refusal
        if (refusal.reason == "ttft" and job.slo is not None
                and refusal.overshoot(job.slo) <= self.refuse_overshoot):
            # a forecast's near miss: accepted, on the forecast's own error
            return slo.refusal(job, waited, self.estimates.policy, self.decode_step_s())
        return refusal._replace(forecast="memory" if memory else "queue", wait_s=seconds,
                                margin=margin, ahead=ahead)

    def wait_s(self, job: Job, pending: Iterable[Job] = ()) -> float:
        """The forecast wait of a new job with an objective, from now: until the jobs ahead
        of it have started, and no sooner than its KV fits beside them."""
        return self._wait_behind(job, self.ahead_of(job, pending)).s

    def _wait_behind(self, job: Job, ahead: Sequence[Job]) -> Wait:
        """How long `job` would wait behind `ahead`: until they have started, and no sooner
        than its KV fits beside them. With nothing ahead, a free slot and its KV fitting
        now, none (work-conserving admission starts it now, whatever the typical-job slot
        count says: at 0.5x, 2 refused on that count started at once)."""
        tokens, context = self.estimates.footprint(job), job.num_context_tokens
        if not ahead and self._starts_now(tokens, context, self.lanes, job):
            return Wait(0.0, 0.0)
        return self._wait_on(self.lanes, ahead, tokens, context)

    def _wait_on(self, lanes: Sequence[Lane], ahead: Sequence[Job], tokens: float,
                 context: int) -> Wait:
        """The wait of a job of footprint `tokens` (`context` held now) behind `ahead` on
        `lanes`. Where every serving lane admits by the KV held now (work-conserving
        memory admission, its engine's capacity known), one forecast of both (_started_in);
        else the slot forecast and the memory bound apart."""
        serving = [lane for lane in lanes if lane.down_reason is None]
        if serving and all(lane.memory_bound and lane.work_conserving
                           and lane.capacity is not None for lane in serving):
            joint = self._started_in(serving, ahead, context)
            return Wait(joint, 0.0) if ahead else Wait(0.0, joint)  # none ahead: memory's
        return Wait(self._start_in(ahead, lanes), self._fits_in(tokens, context, ahead, lanes))

    def _started_in(self, lanes: Sequence[Lane], ahead: Sequence[Job], context: int
                    ) -> float:
        """Seconds until work-conserving admission starts a job with `context` tokens
        behind its share of the first MEMORY_AHEAD jobs `ahead` on some lane of `lanes`
        (admission.seconds_until_started: the jobs ahead start as their contexts find room
        in the KV held now, and end at their predicted service). Beyond MEMORY_AHEAD, jobs
        count at the typical service, spread over the typical-footprint slots."""
        policy, estimates = self.estimates.policy, self.estimates
        first = [(other.num_context_tokens, self._service_s(other))
                 for other in ahead[:MEMORY_AHEAD]]
        step_s = self.decode_step_s()
        start = min(admission.seconds_until_started(
            lane.capacity, lane.kv, slo.running_ends(lane, policy, estimates.left_tokens),
            context, first[k::len(lanes)], step_s, lane.max_running + lane.engine_spare)
            for k, lane in enumerate(lanes) if lane.capacity is not None)
        rest = max(len(ahead) - MEMORY_AHEAD, 0) * estimates.typical_service_s
        return start + rest / max(sum(estimates.slots(lane) for lane in lanes), 1)

    def _starts_now(self, tokens: float, context: int, lanes: Sequence[Lane],
                    job: Job | None = None) -> bool:
        """Whether a job of footprint `tokens` (`context` held now) with nothing ahead
        would start now on a serving lane: a free slot, and its KV admitted (decisions)."""
        policy, left = self.estimates.policy, self.estimates.left_tokens
        return any(lane.down_reason is None and lane.free_slots > 0 and decisions.admits(
            lane, tokens, context, policy, left, job) for lane in lanes)

    def _fits_in(self, tokens: float, context: int, ahead: Sequence[Job],
                 lanes: Sequence[Lane] | None = None) -> float:
        """Seconds until a job of KV footprint `tokens` (`context` of them held now) would
        be admitted on some serving lane (_lane_fits_in), beside its share of the first
        MEMORY_AHEAD jobs `ahead` (which take their room first) and the running jobs as
        they end at their predicted times. The slot forecast counts every job as one
        typical footprint: a bigger one waits for more memory, and the jobs ahead of it
        take what frees first. About 0.06 ms with 64 running and 32 ahead (2 ms with 512
        ahead, hence the cap). A job that would start now (_starts_now) is its callers' to
        see."""
        footprint = self.estimates.footprint
        serving = [lane for lane in (lanes or self.lanes) if lane.down_reason is None]
        first = [(other.num_context_tokens, footprint(other))
                 for other in ahead[:MEMORY_AHEAD]]
        step_s = self.decode_step_s()
        return min((self._lane_fits_in(lane, tokens, context, first[k::len(serving)], step_s)
                    for k, lane in enumerate(serving)), default=math.inf)

    def _lane_fits_in(self, lane: Lane, tokens: float, context: int,
                      first: Sequence[tuple[int, float]], step_s: float) -> float:
        """_fits_in on one lane: 0 by count; under work-conserving admission when the
        context fits in the KV held now (the running jobs growing a token a step until
        they end); under peak admission when the projected peak fits."""
        if not lane.memory_bound:
            return 0.0
        ends = slo.running_ends(lane, self.estimates.policy, self.estimates.left_tokens)
        if lane.work_conserving:
            return admission.seconds_until_room(lane.capacity, lane.kv, ends, context,
                                                [c for c, _ in first], step_s)
        return admission.seconds_until_fits(lane.capacity, lane.kv, ends, tokens, context,
                                            first)

    def turned_late(self, job_id: str, now: float) -> None:
        """A waiting job with an objective passed its latest start at `now`: a sample of
        its promise's error (Promises.started), and a sign of overload."""
        self.overload.turned_late(now)
        self.promises.started(job_id, now)

    def overloaded(self) -> bool:
        """Whether the queue says overload now (Overload.active): on-time jobs by slack."""
        return self.overload.active(self.now())

    def margin(self, memory: bool = False) -> float:
        """The learned margin (a ratio, refuse_quantile of real / forecast wait) of
        forecasts of the work ahead, or (`memory`) of the memory bound; COLD_RATIO before
        it is learned."""
        return self.promises.margin(memory, self.now(), self.refuse_quantile)

    def learned(self, memory: bool = False) -> bool:
        """At least MIN_ERRORS samples of that forecast (Promises.learned)."""
        return self.promises.learned(memory, self.now())

    def decode_step_s(self) -> float:
        """A decode step of the batch a new job would join now (the fullest serving lane's
        running jobs and it, at most the full batch) under the current clock. Not the full
        batch: a TPOT refusal is for what misses however the load moves, and at light load a
        full batch's step (on a slow host, ~60 ms with 64 sequences) refused every request
        whose smaller batch would have met its objective."""
        policy = self.estimates.policy
        running = max((len(lane.running) for lane in self.lanes if lane.down_reason is None),
                      default=0)
        batch = max(min(running + 1, policy.batch_hint), 1)
        return policy.cost.step_s(0, batch, batch * self.estimates.typical.mean_context)

    def latency(self, job: Job) -> slo.Prediction:
        """The job's predicted TTFT and finish, in seconds from its arrival."""
        policy, now = self.estimates.policy, self.now()
        since = now - job.arrival_time
        if job.is_done:
            end = (job.finish_time or now) - job.arrival_time
            return slo.Prediction(end if job.first_token_time is None
                                  else job.first_token_time - job.arrival_time, end)
        if job in self.waiting:  # behind what ranks before it as queued (no policy call)
            keyed = self.waiting.keyed()
            mine = next(((rank, key) for rank, key, other in keyed if other is job), (0, 0.0))
            ahead = [other for rank, key, other in keyed if other is not job and (
                (rank, key) < mine or self.waiting.deadline(other) <= now)]
            start = since + self._wait_behind(job, ahead).s
        else:  # running (or about to be queued: now)
            start = since
        first = (job.first_token_time - job.arrival_time if job.first_token_time is not None
                 else start + policy.cost.prefill_s(job.num_prompt_tokens))
        finish = start + policy.service_s(job)
        return slo.Prediction(first, max(finish, first))

    def ttft_s(self, lane: Lane) -> float:
        """Predicted TTFT of a new best-effort request of class 0 and typical size placed
        on `lane`: behind its share of the waiting jobs of class 0 or more urgent, and no
        sooner than a typical footprint fits beside them. A point forecast: admission
        refuses on it times the learned margin (margin())."""
        serving = [other for other in self.lanes if other.down_reason is None]
        if lane.down_reason is not None or not serving:
            return math.inf
        ahead = [job for job in self.waiting if job.priority <= 0]
        share = ahead[:: len(serving)] if len(serving) > 1 else ahead
        estimates = self.estimates
        prompt = round(estimates.typical.prompt_tokens)
        tokens = estimates.typical_footprint
        wait = (0.0 if not share and self._starts_now(tokens, prompt, [lane])
                else self._wait_on([lane], share, tokens, prompt).s)
        return wait + estimates.policy.cost.prefill_s(prompt)
