"""Forecasts over the core's state: when a new request would start, what goes before it,
its refusal, a queued job's predicted latency, a lane's predicted TTFT, the job to shed."""

from __future__ import annotations

import asyncio
import math

import pytest

from daemon.core.admission import MIN_OBSERVED
from daemon.core.costmodel import CostModel
from daemon.core.events import Capacity, Event
from daemon.core.job import Job, JobStatus, SamplingSpec, Slo
from daemon.core.lanes import Lane
from daemon.core.overload import INFLOW_MIN_ARRIVALS, INFLOW_WINDOW_S, LATE_HORIZON_S, Overload
from daemon.core.ports import SloUnreachable
from daemon.core.scheduler import Scheduler
from daemon.core.settings import SchedulerConfig
from policies.fcfs import FCFS
from tests.support import learn_forecast_errors

# 10 ms per decode step and no prefill cost: a job of n tokens takes n x 10 ms.
COST = CostModel(prefill_base_s=0.0, prefill_per_token_s=0.0, decode_base_s=0.01,
                 decode_per_seq_s=0.0, decode_per_context_token_s=0.0)


def frozen_core(admission: str = "work-conserving") -> Scheduler:
    """A core whose clock stands still: a forecast counts the time since a job's arrival,
    and a loaded machine can take tens of ms between two lines of a test."""
    inbox: asyncio.Queue[Event] = asyncio.Queue()
    frozen = asyncio.get_running_loop().time()
    core = Scheduler([Lane("e0", asyncio.Queue(), 1)], FCFS(cost=COST),  # type: ignore[arg-type]
                     SchedulerConfig(max_running=1, admission=admission), inbox,  # type: ignore[arg-type]
                     clock=lambda: frozen)
    core.accepting = True
    core.waiting.order_by_slack(True)  # overloaded (after_late = 0), as its first round says
    return core


def new_job(name: str, tokens: float, now: float, priority: int = 0,
         slo: Slo | None = None) -> Job:
    return Job(name, [1, 2], SamplingSpec(max_tokens=1000), arrival_time=now,
               priority=priority, predicted_output_tokens=tokens, enqueue_time=now, slo=slo)


@pytest.mark.asyncio
async def test_a_new_request_starts_after_the_running_job_and_the_work_ahead() -> None:
    core = frozen_core()
    now = core.now()
    forecast = core.forecast
    assert forecast.refusal(new_job("n", 5, now, slo=Slo(ttft_s=0.1)), []) is None  # idle
    core.lanes[0].running["r"] = new_job("r", 100, now)  # 1 s left
    urgent = new_job("u", 50, now, priority=-1)  # a more urgent class: 0.5 s more
    best_effort = new_job("b", 500, now)  # behind any job with an objective
    for job in (urgent, best_effort):
        core.waiting.push(job)
    new = new_job("n", 5, now, slo=Slo(ttft_s=1.0))
    assert forecast.ahead_of(new) == [urgent]
    assert forecast.wait_s(new) == pytest.approx(1.5, abs=0.05)
    assert forecast.refusal(new) is None  # no start seen yet: its error is unknown
    learn_forecast_errors(forecast)  # starts came as forecast
    refusal = forecast.refusal(new)
    assert refusal is not None and refusal.cause == "ttft:queue"  # the work ahead said so
    assert refusal.predicted_s == pytest.approx(1.5, abs=0.05)
    assert refusal.retry_after_s == pytest.approx(0.5, abs=0.05)
    assert forecast.refusal(new_job("n", 5, now, slo=Slo(ttft_s=1.6))) is None
    # Arrived, not yet queued: counted when of its class or a more urgent one.
    pending = new_job("p", 100, now)
    assert forecast.ahead_of(new, [pending]) == [urgent, pending]
    assert forecast.ahead_of(new, [new_job("q", 100, now, priority=3)]) == [urgent]


@pytest.mark.asyncio
async def test_on_time_jobs_of_its_class_ahead_by_slack_only_in_overload() -> None:
    """Below overload the on-time jobs of its class wait in the policy's order, where a
    request not yet predicted has no place: all count as ahead. In overload they wait by
    slack: only those that must start earlier."""
    core = frozen_core()
    now = core.now()
    tight, relaxed = (new_job(name, 5, now, slo=Slo(ttft_s=s)) for name, s in
                      (("tight", 0.5), ("relaxed", 5.0)))
    core.waiting.order_by_slack(False)
    for job in (relaxed, tight):
        core.waiting.push(job)
    new = new_job("n", 5, now, slo=Slo(ttft_s=1.0))
    assert {job.job_id for job in core.forecast.ahead_of(new)} == {"tight", "relaxed"}
    core.waiting.order_by_slack(True)
    assert core.forecast.ahead_of(new) == [tight]


@pytest.mark.asyncio
async def test_a_new_request_waits_until_its_kv_fits() -> None:
    """Under memory admission by the projected peak a free slot is not enough: a job whose
    footprint does not fit beside the running ones starts when enough of them have ended."""
    core = frozen_core("peak")
    lane, now = core.lanes[0], core.now()
    lane.set_capacity(Capacity("e0", kv_blocks=10, block_size=16, max_num_seqs=8), None)
    for name, tokens in (("short", 50), ("long", 200)):  # 0.5 s and 2 s left, 4 blocks each
        job = new_job(name, tokens, now)
        lane.running[name] = job
        lane.kv.reserve(name, 64, context_tokens=2)
    assert core.estimates.slots(lane) == 8  # by count: a slot is free now
    small = new_job("small", 10, now, slo=Slo(ttft_s=0.4))  # 2 + 10 tokens: one block
    assert core.forecast.wait_s(small) == 0.0
    big = new_job("big", 60, now, slo=Slo(ttft_s=1.0))  # 2 + 60 tokens: four blocks
    assert core.forecast.wait_s(big) == pytest.approx(0.5, abs=0.05)  # after "short"
    huge = new_job("huge", 120, now, slo=Slo(ttft_s=1.0))  # 8 blocks: both must end
    assert core.forecast.wait_s(huge) == pytest.approx(2.0, abs=0.05)
    # A job ahead of it (a tighter objective) takes what "short" frees first.
    ahead = new_job("ahead", 60, now, slo=Slo(ttft_s=0.5))
    core.waiting.push(ahead)
    assert core.forecast.ahead_of(big) == [ahead]
    assert core.forecast.wait_s(big) == pytest.approx(2.0, abs=0.05)
    assert core.forecast.refusal(huge) is None  # its error unknown: nothing is refused
    learn_forecast_errors(core.forecast, memory=True)  # under peak admission, on time
    refusal = core.forecast.refusal(huge)
    assert refusal is not None and refusal.cause == "ttft:memory"  # its KV fitting said so
    # The predicted-latency header and the router's metric see memory too: queued behind
    # "ahead", "huge" starts when both running jobs have ended, and so would a new request.
    core.waiting.push(huge)
    assert core.forecast.latency(huge).ttft_s == pytest.approx(2.0, abs=0.05)
    assert core.forecast.ttft_s(lane) == pytest.approx(2.0, abs=0.05)


@pytest.mark.asyncio
async def test_work_conserving_a_request_that_can_start_now_is_forecast_no_wait() -> None:
    """Work-conserving admission: what fits in the KV held now starts now (its wait for the
    projected peak, 0.5 s, is dearer than a recompute), so it is forecast no wait and never
    refused for memory; what does not fit now still waits for the running jobs to end."""
    core = frozen_core()
    lane, now = core.lanes[0], core.now()
    lane.set_capacity(Capacity("e0", kv_blocks=10, block_size=16, max_num_seqs=8), None)
    for name, tokens in (("short", 50), ("long", 200)):
        lane.running[name] = new_job(name, tokens, now)
        lane.kv.reserve(name, 64, context_tokens=2)
    big = new_job("big", 60, now, slo=Slo(ttft_s=0.4))  # 4 blocks at its peak, 2 + 16 now
    assert core.forecast.wait_s(big) == 0.0
    assert core.forecast.refusal(big) is None
    wide = new_job("wide", 60, now, slo=Slo(ttft_s=1.0))
    wide.prompt_token_ids = [1] * 150  # 11 blocks now: more than the cache holds beside them
    assert core.forecast.wait_s(wide) == pytest.approx(2.0, abs=0.05)


@pytest.mark.asyncio
async def test_a_running_job_past_its_prediction_is_not_about_to_end() -> None:
    core = frozen_core()
    now = core.now()
    running = new_job("r", 5, now)  # predicted 5 tokens, already 50 generated
    running.generated_token_ids = [1] * 50
    core.lanes[0].running["r"] = running
    new = new_job("n", 5, now, slo=Slo(ttft_s=10.0))
    assert core.forecast.wait_s(new) == pytest.approx(0.01, abs=0.005)  # its last token
    for n in range(MIN_OBSERVED):  # answers of 100 tokens were seen
        done = new_job(f"d{n}", 5, now)
        done.generated_token_ids = [1] * 100
        done.status, done.finish_reason = JobStatus.FINISHED, "stop"
        core.estimates.footprints.observe(done)
    assert core.forecast.wait_s(new) == pytest.approx(0.5, abs=0.05)  # 50 more x 10 ms


@pytest.mark.asyncio
async def test_predicted_latency_of_a_queued_job_and_of_a_lane() -> None:
    core = frozen_core()
    now = core.now()
    core.lanes[0].running["r"] = new_job("r", 100, now)
    first, second = new_job("a", 20, now), new_job("b", 30, now + 0.001)
    for job in (first, second):
        core.waiting.push(job)
    got = core.forecast.latency(second)  # after r (1 s) and a (0.2 s), then its own 0.3 s
    assert got.ttft_s == pytest.approx(1.2, abs=0.05)
    assert got.finish_s == pytest.approx(1.5, abs=0.05)
    assert core.forecast.ttft_s(core.lanes[0]) == pytest.approx(1.5, abs=0.05)
    core.lanes[0].down_reason = "restarting"
    assert math.isinf(core.forecast.ttft_s(core.lanes[0]))


@pytest.mark.asyncio
async def test_only_a_less_urgent_sheddable_job_gives_up_its_room() -> None:
    core = frozen_core()
    now = core.now()
    older = new_job("old", 10, now, priority=5, slo=Slo(sheddable=True))
    newer = new_job("new", 10, now + 1, priority=5, slo=Slo(sheddable=True))
    keeper = new_job("keep", 10, now, priority=9)  # not sheddable
    for job in (older, newer, keeper):
        core.waiting.push(job)
    assert core.waiting.sheddable_for(new_job("x", 1, now), set()) is newer
    assert core.waiting.sheddable_for(new_job("x", 1, now), {"new"}) is older
    assert core.waiting.sheddable_for(new_job("x", 1, now, priority=5), set()) is None


@pytest.mark.asyncio
async def test_a_forecast_refuses_only_once_waiting_jobs_turned_late() -> None:
    """With [slo] refuse_after_late = 2, a forecast of the queue refuses nothing until two
    waiting jobs passed their latest start in the last LATE_HORIZON_S: the core's decision
    round tells it (Forecaster.turned_late); a refusal on a forecast carries the overload
    on, and it lapses LATE_HORIZON_S after the last of them. The round orders on-time jobs
    by slack while it lasts (WaitQueue.order_by_slack), the forecast's order.
    A refusal that needs no forecast (the objective missed by the time waited already)
    stands either way."""
    core = frozen_core()
    forecast, now = core.forecast, core.now()
    forecast.overload.after_late = 2
    core.waiting.late_in_place = False  # [slo] late = "behind": the late jobs go after "n"
    core.waiting.order_by_slack(False)
    core.lanes[0].running["r"] = new_job("r", 100, now)  # a forecast wait of 1 s
    learn_forecast_errors(forecast)
    new = new_job("n", 5, now, slo=Slo(ttft_s=0.5))
    assert forecast.refusal(new) is None  # the queue has failed nobody yet
    for k in range(2):  # two on-time jobs whose latest start has passed
        core.waiting.push(new_job(f"late{k}", 5, now - 10.0, slo=Slo(ttft_s=1.0)))
    core.dispatch()
    assert len(core.waiting) == 2 and all(job.slo_missed for job in core.waiting)
    assert forecast.overloaded() and core.waiting.by_slack
    refused = forecast.refusal(new)
    assert refused is not None and refused.predicted_s == pytest.approx(1.0, abs=0.02)
    later = now + 0.9 * LATE_HORIZON_S
    forecast.now = lambda: later  # type: ignore[method-assign]
    with pytest.raises(SloUnreachable):  # a refusal: the overload goes on from it
        forecast.admit(new_job("m", 5, later, slo=Slo(ttft_s=0.5)), [], 0, 10, set())
    forecast.now = lambda: now + LATE_HORIZON_S + 1.0  # type: ignore[method-assign]
    assert forecast.overloaded()
    forecast.now = lambda: later + LATE_HORIZON_S + 1.0  # type: ignore[method-assign]
    learn_forecast_errors(forecast)
    assert not forecast.overloaded()
    core.dispatch()
    assert not core.waiting.by_slack  # the policy's order again
    waited = new_job("w", 5, now - 2.0, slo=Slo(ttft_s=0.5))  # 0.5 s objective, 2 s waited
    assert forecast.refusal(waited) is not None


def test_the_inflow_is_read_at_an_arrival_and_held() -> None:
    """[slo] refuse_inflow = 1.25: an arrival reads arrivals / ends over the last
    INFLOW_WINDOW_S (none read below INFLOW_MIN_ARRIVALS arrivals); one that reads 1.25 or
    more lets the gate refuse for LATE_HORIZON_S; the window forgets what is older."""
    overload = Overload()  # after_late = 0: late jobs always say overload
    assert overload.refusing(0.0)  # refuse_inflow off: the late jobs' gate alone
    overload.inflow = 1.25
    assert not overload.refusing(0.0)
    for k in range(INFLOW_MIN_ARRIVALS - 1):  # 7 arrivals, no end: too few to read
        overload.arrived(k * 0.1)
    assert overload.inflow_ratio(1.0) == INFLOW_MIN_ARRIVALS - 1
    assert not overload.refusing(1.0)
    for k in range(6):  # 8 arrivals over 6 ends: 1.33
        overload.ended(1.0)
    overload.arrived(1.0)
    assert overload.inflow_ratio(1.0) == pytest.approx(8 / 6) and overload.refusing(1.0)
    assert overload.refusing(1.0 + LATE_HORIZON_S - 0.5)  # held, with no arrival since
    assert not overload.refusing(1.0 + LATE_HORIZON_S + 0.5)
    overload.ended(2.0)
    overload.arrived(2.0)  # 9 over 7: 1.29, read again
    assert overload.refusing(2.0 + LATE_HORIZON_S - 0.5)
    for k in range(2):
        overload.ended(3.0)
    overload.arrived(3.0)  # 10 over 9: 1.11, not over; the last read holds still
    assert overload.inflow_ratio(3.0) == pytest.approx(10 / 9)
    assert not overload.refusing(2.0 + LATE_HORIZON_S + 0.5)
    late = 3.0 + INFLOW_WINDOW_S + 1.0  # all of it out of the window
    assert overload.inflow_ratio(late) == 0.0
    overload.after_late = 1  # and the late jobs' gate still asked: none late
    for k in range(INFLOW_MIN_ARRIVALS):
        overload.arrived(late)
    assert overload.inflow_ratio(late) == INFLOW_MIN_ARRIVALS and not overload.refusing(late)
    overload.turned_late(late)
    assert overload.refusing(late)
    quiet = Overload()  # refuse_inflow off: nothing reads the counts; they stay bounded
    for second in range(10 * INFLOW_WINDOW_S):
        quiet.arrived(float(second))
        quiet.ended(float(second))
    assert len(quiet._arrived._seconds) <= INFLOW_WINDOW_S + 1
    assert len(quiet._ended._seconds) <= INFLOW_WINDOW_S + 1


@pytest.mark.asyncio
async def test_with_refuse_inflow_a_forecast_refuses_only_while_work_comes_in_faster(
        ) -> None:
    """Admission counts each arrival and the core each end (handling._end); with
    refuse_inflow set, a forecast that misses the objective is accepted while requests end
    as fast as they come, refused once they come faster, and a refusal counts as an
    arrival that never ends."""
    core = frozen_core()
    forecast, now = core.forecast, core.now()
    forecast.overload.inflow = 1.25
    core.lanes[0].running["r"] = new_job("r", 100, now)  # a forecast wait of 1 s
    learn_forecast_errors(forecast)
    for k in range(INFLOW_MIN_ARRIVALS):  # best-effort requests that come and go
        job = new_job(f"b{k}", 5, now)
        forecast.admit(job, [], 0, 100, set())
        core.forecast.overload.ended(now)
    assert forecast.overloaded() and not forecast.overload.refusing(now)
    assert forecast.refusal(new_job("n", 5, now, slo=Slo(ttft_s=0.5))) is None
    for k in range(3):  # three more that stay: 11 over 8
        forecast.admit(new_job(f"s{k}", 5, now), [], 0, 100, set())
    assert forecast.overload.refusing(now)
    with pytest.raises(SloUnreachable):
        forecast.admit(new_job("m", 5, now, slo=Slo(ttft_s=0.5)), [], 0, 100, set())
    assert forecast.overload.inflow_ratio(now) == pytest.approx(12 / 8)
    assert forecast.refusal(new_job("p", 5, now, slo=Slo(ttft_s=0.5))) is not None
    assert forecast.overload.inflow_ratio(now) == pytest.approx(13 / 8)  # the probe's


@pytest.mark.asyncio
async def test_a_forecast_refuses_only_past_the_overshoot() -> None:
    """[slo] refuse_overshoot: a forecast's first token 2x the objective is refused at 1.0
    and 1.5, accepted at 2.5; one already late by the time waited is refused at any (here
    100: not on the forecast, on the time waited)."""
    core = frozen_core()
    forecast, now = core.forecast, core.now()
    core.lanes[0].running["r"] = new_job("r", 100, now)  # a forecast wait of 1 s
    learn_forecast_errors(forecast)
    for overshoot, refused in ((1.0, True), (1.5, True), (2.5, False)):
        forecast.refuse_overshoot = overshoot
        refusal = forecast.refusal(new_job("n", 5, now, slo=Slo(ttft_s=0.5)))
        assert (refusal is not None) is refused, overshoot
        if refusal is not None:
            assert refusal.overshoot(Slo(ttft_s=0.5)) == pytest.approx(2.0, abs=0.05)
    forecast.refuse_overshoot = 100.0
    waited = forecast.refusal(new_job("w", 5, now - 2.0, slo=Slo(ttft_s=0.5)))
    assert waited is not None and waited.forecast == "none"


@pytest.mark.asyncio
async def test_a_request_that_starts_now_waits_for_no_typical_slot() -> None:
    """Memory admission counts slots in typical footprints: one running job of the typical
    size fills this lane by that count, but a small job fits beside it now and starts now,
    so it is forecast no wait and, whatever the errors seen, refused nothing."""
    core = frozen_core("peak")
    forecast, lane, now = core.forecast, core.lanes[0], core.now()
    lane.set_capacity(Capacity("e0", kv_blocks=10, block_size=16, max_num_seqs=8), None)
    core.estimates.launched(100.0)  # 7 blocks: one typical job fills the lane's slots
    lane.running["r"] = new_job("r", 100, now)  # 1 s left
    lane.kv.reserve("r", 64, context_tokens=2)
    assert core.estimates.slots(lane) == 1 and lane.free_slots > 0
    small = new_job("small", 10, now, slo=Slo(ttft_s=0.2))
    assert forecast.wait_s(small) == 0.0
    assert forecast.refusal(small) is None
    core.waiting.push(new_job("queued", 10, now, slo=Slo(ttft_s=0.1)))  # goes first
    assert forecast.wait_s(small) == pytest.approx(1.1, abs=0.05)  # behind it, by the count


@pytest.mark.asyncio
async def test_a_tpot_objective_is_judged_on_the_batch_it_would_join_not_a_full_one() -> None:
    """A step of a full batch (8 here) would break a 30 ms TPOT objective, but on an idle
    engine the job decodes alone: it is accepted; beside a full lane it is refused."""
    inbox: asyncio.Queue[Event] = asyncio.Queue()
    cost = CostModel(prefill_base_s=0.0, prefill_per_token_s=0.0, decode_base_s=0.02,
                     decode_per_seq_s=0.005, decode_per_context_token_s=0.0)
    core = Scheduler([Lane("e0", asyncio.Queue(), 8)], FCFS(cost=cost),  # type: ignore[arg-type]
                     SchedulerConfig(max_running=8, learn_clock=False), inbox)
    core.accepting = True
    now = core.now()
    assert core.policy.batch_hint == 8  # a full batch's step: 60 ms
    alone = new_job("alone", 10, now, slo=Slo(tpot_s=0.03))  # alone: 25 ms
    assert core.forecast.refusal(alone) is None
    for k in range(8):
        core.lanes[0].running[f"r{k}"] = new_job(f"r{k}", 10, now)
    refusal = core.forecast.refusal(new_job("crowded", 10, now, slo=Slo(tpot_s=0.03)))
    assert refusal is not None and refusal.reason == refusal.cause == "tpot"
