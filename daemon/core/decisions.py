"""A decision round's choices: which waiting job to launch where (and whether its KV fits
there), and which running jobs waiting ones should replace now.

Each rule yields its choices one at a time, in order, and the core acts on each (launches
it, or stops it) before the rule goes on: generators, so the policy sees every earlier
choice's effect, as when the core asked inline. Preemption counts slots already being freed
by earlier preemptions; a promoted job, one at the policy's preemption bound, and one that
cannot resume exactly are never victims.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence

from daemon.core import admission, guard, slo
from daemon.core.events import Launch
from daemon.core.job import Job, JobStatus, StopRequest
from daemon.core.lanes import Lane
from daemon.core.policy import DispatchContext, ExecutorView, Policy
from daemon.core.settings import PastPromoted
from daemon.core.stream import OutputStream
from daemon.core.waitqueue import WaitQueue

log = logging.getLogger(__name__)
BACKFILL_CANDIDATES = 32  # waiting jobs behind a blocked head that may start before it


def assignments(ctx: DispatchContext, policy: Policy, lookahead: bool
                ) -> Iterator[tuple[Job, ExecutorView]]:
    """(waiting job, executor with a free slot) to launch, while slots are free: jobs
    promoted by aging first, whatever the policy; else the policy's pick, unless the
    look-ahead guard (core/guard.py, with `lookahead`) starts the earliest deadline instead.
    A job launched because of its bound is marked promoted (never preempted)."""
    for _ in range(sum(ex.free_slots for ex in ctx.executors)):
        promoted = ctx.waiting.oldest_promoted(ctx.now)  # aging beats every policy
        pick: tuple[Job, ExecutorView] | None
        if promoted is not None:
            free = ctx.free_executors()
            pick = (promoted, policy.choose_executor(promoted, free)) if free else None
        else:
            pick = policy.next_assignment(ctx)
            if pick is not None and lookahead:
                pick = _guard(pick, ctx, policy)
        if pick is None:
            return
        pick[0].promoted = pick[0] is promoted or pick[0].promoted
        yield pick


def launches(ctx: DispatchContext, policy: Policy, lookahead: bool, lanes: Mapping[str, Lane],
             footprint: Callable[[Job], float], left: slo.Left, backfills: bool = True,
             past_promoted: PastPromoted = "any") -> Iterator[tuple[Job, Lane]]:
    """The assignments, each on a lane where its KV `footprint` fits (lane_that_fits), until
    one fits nowhere yet (it waits; jobs behind it that end before it could start go first,
    with `backfills`; past a head aging promoted, the jobs `past_promoted` names:
    SchedulerConfig.backfill_past_promoted) or the policy proposes an invalid one
    (logged)."""
    for job, view in assignments(ctx, policy, lookahead):
        lane = lanes.get(view.name)
        if lane is None or lane.free_slots <= 0 or job not in ctx.waiting:
            log.error("policy %s proposed an invalid dispatch of %s to %s", policy.name,
                      job.job_id, view.name)
            return
        lane = lane_that_fits(job, lane, footprint(job), list(lanes.values()), policy, left)
        if lane is None:
            if backfills:
                yield from backfill(ctx, policy, job, lanes, footprint, left,
                                    past_promoted if job.promoted else "any")
            return
        yield job, lane


def backfill(ctx: DispatchContext, policy: Policy, head: Job, lanes: Mapping[str, Lane],
             footprint: Callable[[Job], float], left: slo.Left,
             past: PastPromoted = "any") -> Iterator[tuple[Job, Lane]]:
    """EASY backfilling (Lifka 1995, as Slurm's backfill scheduler): `head`, the next job
    in order, fits on no lane yet. Jobs behind it, in order, start now on a lane where their
    KV fits and their predicted service ends before the head would start there (when the
    running jobs' predicted ends free enough for its projected peak; with
    Lane.backfill_by_room, for its context in the KV held now): they use memory that would
    idle until then, and, as far as the predictions hold, do not delay the head. Without
    this, one large job at the head of the queue (often one promoted by aging) holds every
    smaller one back while the running set drains, and batches shrink exactly when the
    queue is longest. `past` (SchedulerConfig.backfill_past_promoted, for a head aging
    promoted): "promoted", only jobs aging promoted too go first; "none", none on the lane
    where the head would start first (on the others, as before); "upper", only jobs whose
    service at their upper estimate (the footprint's answer length) ends before it, as
    conservative backfilling guards against runtimes that were underestimated."""
    context = head.num_context_tokens
    until = {}
    for lane in lanes.values():
        if lane.memory_bound and lane.free_slots > 0:
            ends = slo.running_ends(lane, policy, left)
            until[lane.name] = (
                admission.seconds_until_room(lane.capacity, lane.kv, ends, context)
                if lane.backfill_by_room else
                admission.seconds_until_fits(lane.capacity, lane.kv, ends, footprint(head),
                                             context))
    if past == "none" and until:
        del until[min(until, key=until.__getitem__)]
    if not until:
        return
    take = ctx.waiting.promoted if past == "promoted" else ctx.waiting.best
    for job in take(ctx.now, BACKFILL_CANDIDATES):
        if job is head:
            continue
        tokens, job_context = footprint(job), job.num_context_tokens
        service = policy.service_s(job, tokens - job_context if past == "upper" else None)
        for name, head_starts in until.items():
            lane = lanes[name]
            if service <= head_starts and lane.free_slots > 0 and lane.fits(tokens, job_context):
                yield job, lane
                break



def lane_that_fits(job: Job, lane: Lane, kv_tokens: float, lanes: Sequence[Lane],
                   policy: Policy, left: slo.Left | None = None) -> Lane | None:
    """`lane` if the job may start there now (admits); else the policy's choice among the
    other lanes with a free slot where it may; None when it may start nowhere yet."""
    context = job.num_context_tokens
    if admits(lane, kv_tokens, context, policy, left, job):
        return lane
    others = {other.name: other for other in lanes if other is not lane
              and other.free_slots > 0 and admits(other, kv_tokens, context, policy, left, job)}
    if not others:
        return None
    return others.get(policy.choose_executor(job, list(others.values())).name)


def admits(lane: Lane, kv_tokens: float, context: int, policy: Policy,
           left: slo.Left | None, job: Job | None = None) -> bool:
    """Memory admission (core/admission.py): the job's KV footprint fits at the projected
    peak; or its context fits in the KV held now and (scheduler.admission = "now", the
    default) that is enough, or ("work-conserving") waiting for the peak to fit would cost
    more than the preemption the overflow may cause (by count only: a free slot is
    enough). The preemption is of vLLM's victim among the running jobs and `job` itself,
    which would be started last (under scheduler.engine_order = "launch", of its class it
    is the victim: its own recompute is the price)."""
    if lane.fits(kv_tokens, context):
        return True
    if not lane.fits_now(context):
        return False
    if not lane.prices_overcommit:  # scheduler.admission = "now"
        return True
    if left is None:
        return False
    wait = admission.seconds_until_fits(lane.capacity, lane.kv,
                                        slo.running_ends(lane, policy, left), kv_tokens, context)
    # vLLM's victim: the running request it ranks last, ties to the one added last
    ranked = [(policy.vllm_priority(other), other.launch_time, other.num_context_tokens)
              for other in lane.running.values()]
    if job is not None:
        ranked.append((policy.vllm_priority(job), math.inf, context))
    victim_context = max(ranked)[2]
    return admission.overcommit_pays(wait, victim_context, len(lane.running),
                                     policy.cost.prefill_s)


def hold_reason(lane: Lane, job: Job, kv_tokens: float, policy: Policy,
                left: slo.Left) -> str | None:
    """Why a decision round left `job` (the next in order, not launched) waiting although
    `lane` has a free slot; None where it has none (nothing to explain).
    "cache-full": the KV held now, as lengthwise counts it (Lane.held_now_blocks), leaves
    no room for its context and next tokens;
    "wait-is-cheaper": room frees sooner than a preemption would cost (admits);
    "peak": scheduler.admission = "peak" holds it until the projected peak fits;
    "policy": admission would start it but the policy's order or pacing chose no launch
    (e.g. scls's batching interval, or a job the look-ahead guard put first elsewhere)."""
    context = job.num_context_tokens
    if lane.free_slots <= 0:
        return None
    if not lane.memory_bound:
        return "policy"
    if not lane.room_now(context):
        return "cache-full"
    if admits(lane, kv_tokens, context, policy, left, job):
        return "policy"
    return "wait-is-cheaper" if lane.work_conserving else "peak"


def _guard(pick: tuple[Job, ExecutorView], ctx: DispatchContext, policy: Policy
           ) -> tuple[Job, ExecutorView]:
    # Jobs running together at load: the count cap, or what memory admission fits.
    slots = policy.batch_hint * len(ctx.executors)
    head = guard.overrule(pick[0], ctx.waiting, policy.service_s, ctx.running_jobs(), slots,
                          ctx.now)
    if head is None:
        return pick
    head.promoted = True
    return head, policy.choose_executor(head, ctx.free_executors())


def displaced(ctx: DispatchContext, lanes: Sequence[Lane]) -> Iterator[Job]:
    """A job handed to a full engine past its own cap (scheduler.engine_queue) waits in the
    engine's queue ahead of every job that arrives after it. One that has not started yields
    its place to a waiting job of a more urgent rank (its class, then an objective it can
    still meet before best effort: WaitQueue.rank): stopped before its first token, it
    waits again, and the urgent job takes its place at a following round. Within a rank
    the early hand-off stands: the slot refill it buys is worth more than one job's order
    (docs/results/2026-11-27-sweep-4-slots.md). One at a time per lane."""
    head = ctx.waiting.best(ctx.now, 1)
    if not head:
        return
    best = WaitQueue.rank(head[0])
    for lane in lanes:
        if lane.engine_spare == 0 or lane.free_slots > 0:
            continue
        fresh = [job for job in lane.running.values() if job.first_token_time is None]
        if any(job.stop_request is not None for job in fresh):
            continue  # one displaced already: its place frees when it stops
        # The least urgent, and of those the last handed over (the engine's queue is
        # where it waits; the earlier ones hold its seats, their first token on its way).
        worst = max(reversed(fresh), key=WaitQueue.rank, default=None)
        if worst is not None and WaitQueue.rank(worst) > best:
            yield worst


def preemptible(ctx: DispatchContext, limit: int | None) -> tuple[int, list[Job]]:
    """(running jobs already being preempted, jobs that may still be), with `limit` the most
    preemptions one job may suffer (None: unbounded)."""
    pending, eligible = 0, []
    for job in ctx.running_jobs():
        if job.stop_request == StopRequest.PREEMPT:
            pending += 1
        elif (job.stop_request is None and not job.promoted and job.resumes_exactly
              and (limit is None or job.num_preemptions < limit)):
            eligible.append(job)
    return pending, eligible


def for_promoted(ctx: DispatchContext, policy: Policy, lanes: Mapping[str, Lane],
                 footprint: Callable[[Job], float]) -> Iterator[Job]:
    """Jobs past their wait bound that found no room each replace the running job with the
    most predicted work left, if that is more than their own and its leaving makes room for
    them (_makes_room): the bound holds even when long jobs hold every slot. A running job
    whose leaving would not let the promoted one start is not stopped: backfill would start
    another in its room and the next round stop that one, round after round."""
    pending, eligible = preemptible(ctx, policy.max_preemptions)
    if not eligible:
        return
    service = policy.service_s
    work = {job.job_id: service(job) for job in eligible}  # once per round, not per candidate
    candidates = ctx.waiting.promoted(ctx.now, pending + len(eligible))[pending:]
    eligible.sort(key=lambda job: work[job.job_id], reverse=True)  # most work left first
    for candidate in candidates:
        own, tokens, context = service(candidate), footprint(candidate), candidate.num_context_tokens
        longer = [job for job in eligible if work[job.job_id] > own]
        # A lane where even all of them leaving would not make room has no victim (one
        # projection per lane, instead of one per job, in the common case under overload).
        hopeless = {name for name in {job.executor_name for job in longer}
                    if not _makes_room([job for job in longer if job.executor_name == name],
                                       lanes.get(name or ""), tokens, context)}
        victim = next((job for job in longer if job.executor_name not in hopeless
                       and _makes_room([job], lanes.get(job.executor_name or ""), tokens,
                                       context)), None)
        if victim is None:
            return
        eligible.remove(victim)
        yield victim
        if not eligible:
            return


def _makes_room(victims: Sequence[Job], lane: Lane | None, kv_tokens: float,
                context_tokens: int) -> bool:
    """Whether a job of this KV footprint fits on the victims' lane once they and the jobs
    already being preempted there have left (by count only: a slot frees)."""
    if lane is None:
        return False
    named = {job.job_id for job in victims}
    leaving = frozenset(job.job_id for job in lane.running.values()
                        if job.job_id in named or job.stop_request == StopRequest.PREEMPT)
    return lane.fits(kv_tokens, context_tokens, leaving)


def by_policy(ctx: DispatchContext, policy: Policy) -> Iterator[Job]:
    """Each waiting job in order may replace one running job, as long as the policy says it
    pays (Policy.choose_victim)."""
    pending, eligible = preemptible(ctx, policy.max_preemptions)
    if not eligible:
        return
    for candidate in ctx.waiting.best(ctx.now, pending + len(eligible))[pending:]:
        victim = policy.choose_victim(candidate, eligible, ctx.now)
        if victim is None or victim not in eligible:
            return
        eligible.remove(victim)
        yield victim
        if not eligible:
            return


def launch(job: Job, lane: Lane, policy: Policy, now: float, kv_tokens: float,
           stream: OutputStream) -> Launch:
    """Mark `job` launched on `lane` (its KV `kv_tokens` reserved there) and give the
    command that starts it: the rest of its budget, or the policy's slice (none for a job
    that cannot resume exactly)."""
    job.status = JobStatus.RUNNING
    job.waited_s += now - job.enqueue_time
    job.estimated_wait_s = None
    job.executor_name = lane.name
    job.num_dispatches += 1
    if job.first_launch_time is None:
        job.first_launch_time = now
    job.launch_time = now
    job.tokens_at_dispatch = job.num_generated_tokens
    job.stop_request = None
    job.checkpoint_tokens = policy.next_checkpoint(job)
    lane.admit(job, kv_tokens)
    lane.stats.jobs_started += 1
    budget = job.num_remaining_budget_tokens
    if job.resumes_exactly and (slice_tokens := policy.token_budget(job)) is not None:
        budget = min(budget, slice_tokens)
    return Launch(
        job_id=job.job_id, dispatch=job.num_dispatches, prompt_token_ids=job.prompt_token_ids,
        generated_token_ids=list(job.generated_token_ids), sampling=job.sampling,
        max_new_tokens=budget, engine_priority=policy.vllm_priority(job), stream=stream,
        resume_offloaded=job.kv_offloaded, true_output_tokens=job.true_output_tokens)
