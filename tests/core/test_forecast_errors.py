"""The forecast's learned error at work (core/promises.py through the forecaster): which
starts teach it, how a margin scales a wait and refuses only surer misses, the memory
bound's own margin, and a bad spell's ratio lapsing without refusing what would start now."""

from __future__ import annotations

import numpy as np
import pytest

from daemon.core.events import Capacity
from daemon.core.job import Job, Slo
from daemon.core.promises import COLD_RATIO, ERROR_HORIZON_S, MIN_ERRORS
from tests.core.test_forecast import frozen_core, new_job


@pytest.mark.asyncio
async def test_promises_made_below_overload_teach_nothing() -> None:
    """Below overload the queue is not in the forecast's order: a start then is no sample
    of the forecast's error."""
    core = frozen_core()
    forecast, now = core.forecast, core.now()
    core.lanes[0].running["r"] = new_job("r", 100, now)  # a forecast wait of 1 s
    core.waiting.order_by_slack(False)
    below = new_job("b", 5, now, slo=Slo(ttft_s=5.0))
    assert forecast.admit(below, [], 0, 10, set()) is None
    forecast.promises.started(below.job_id, now + 3.0)
    assert not forecast.promises.ratios(False, now)
    core.waiting.order_by_slack(True)
    over = new_job("o", 5, now, slo=Slo(ttft_s=5.0))
    assert forecast.admit(over, [], 0, 10, set()) is None
    forecast.promises.started(over.job_id, now + 3.0)
    assert forecast.promises.ratios(False, now) == [pytest.approx(3.0, abs=0.05)]


@pytest.mark.asyncio
async def test_admission_scales_waits_by_the_errors_it_has_seen() -> None:
    core = frozen_core()
    forecast = core.forecast
    now = core.now()
    core.lanes[0].running["r"] = new_job("r", 100, now)  # a forecast wait of 1 s
    for k in range(MIN_ERRORS):  # each started 1.5 s after its admission
        job = new_job(f"j{k}", 5, now, slo=Slo(ttft_s=5.0))
        assert forecast.admit(job, [], 0, 10, set()) is None
        forecast.promises.started(job.job_id, now + 1.5)
    assert forecast.margin() == pytest.approx(1.5, abs=0.01)
    idle = frozen_core().forecast  # a job that would start now is promised nothing
    admitted = new_job("i", 5, now, slo=Slo(ttft_s=5.0))
    assert idle.admit(admitted, [], 0, 10, set()) is None
    idle.promises.started(admitted.job_id, now + 3.0)
    assert not idle.promises.ratios(False, now)
    assert forecast.refusal(new_job("n", 5, now, slo=Slo(ttft_s=1.6))) is None
    refusal = forecast.refusal(new_job("n", 5, now, slo=Slo(ttft_s=1.4)))
    assert refusal is not None and refusal.predicted_s == pytest.approx(1.5, abs=0.02)


@pytest.mark.asyncio
async def test_admission_refuses_only_what_misses_even_at_an_early_start() -> None:
    """Refusals are meant to be right: with starts at 0.3-2.0x their forecasts, admission
    refuses on the median of those errors ([slo] refuse_quantile), so a forecast that errs
    high refuses less than it says: a job whose 1 s forecast wait would miss a 0.95 s
    objective at face value is accepted; at the 10th percentile only surer misses are
    refused (a start as early as 0.3x its forecast would still miss)."""
    core = frozen_core()
    forecast = core.forecast
    now = core.now()
    core.lanes[0].running["r"] = new_job("r", 100, now)  # a forecast wait of 1 s
    ratios = [0.3, 0.3, 0.4, 0.6, 0.8, 1.0, 1.2, 1.5, 1.8, 2.0]
    for k, ratio in enumerate(ratios):
        job = new_job(f"j{k}", 5, now, slo=Slo(ttft_s=60.0))
        assert forecast.admit(job, [], 0, 10, set()) is None
        forecast.promises.started(job.job_id, now + ratio)
    assert forecast.margin() == pytest.approx(0.9, abs=0.01)
    assert forecast.refusal(new_job("n", 5, now, slo=Slo(ttft_s=0.95))) is None
    refused = forecast.refusal(new_job("n", 5, now, slo=Slo(ttft_s=0.85)))
    assert refused is not None and refused.predicted_s == pytest.approx(0.9, abs=0.02)
    # what it was refused on: a wait of 1 s behind nothing waiting, x the margin
    assert refused.forecast == "queue" and refused.ahead == 0
    assert refused.wait_s == pytest.approx(1.0, abs=0.02)
    assert refused.margin == pytest.approx(0.9, abs=0.01)
    forecast.refuse_quantile = 10.0
    assert forecast.margin() == pytest.approx(float(np.percentile(ratios, 10)), abs=0.01)
    assert forecast.refusal(new_job("n", 5, now, slo=Slo(ttft_s=0.35))) is None
    refused = forecast.refusal(new_job("n", 5, now, slo=Slo(ttft_s=0.25)))
    assert refused is not None and refused.predicted_s == pytest.approx(0.3, abs=0.02)


@pytest.mark.parametrize("admission", ["work-conserving", "peak"])
@pytest.mark.asyncio
async def test_waits_bound_by_memory_learn_their_own_error(admission: str) -> None:
    """A forecast bound by the KV fitting errs apart from one of the work ahead, and learns
    its own margin. Under peak admission it refuses once that error is learned (before,
    the slot forecast stands); starts sooner than such forecasts lower only the memory
    margin, and only refusals bound by memory become rarer. Under work-conserving admission
    the wait of a job with jobs ahead is one forecast of both (Forecaster._started_in),
    which learns the margin of the work ahead; with none ahead the engine starts it once its
    context fits now (and makes room by preemption): refused on memory alone, never."""
    core = frozen_core(admission)
    forecast, lane, now = core.forecast, core.lanes[0], core.now()
    lane.set_capacity(Capacity("e0", kv_blocks=10, block_size=16, max_num_seqs=8), None)
    for name, tokens in (("short", 50), ("long", 200)):  # 0.5 s and 2 s left, 4 blocks each
        lane.running[name] = new_job(name, tokens, now)
        lane.kv.reserve(name, 64, context_tokens=64)  # held now

    def wide(name: str, ttft_s: float) -> Job:  # 3 blocks now (8 of 10 held), 9 at its peak
        job = new_job(name, 100, now, slo=Slo(ttft_s=ttft_s))
        job.prompt_token_ids = [1] * 40
        return job

    # Nothing queued ahead: work-conserving admission starts it once its context fits now,
    # so a wait bound by memory alone refuses nothing.
    assert forecast.wait_s(wide("n", 1.0)) == pytest.approx(2.0, abs=0.05)
    assert forecast.refusal(wide("n", 1.0)) is None
    ahead = new_job("ahead", 10, now, slo=Slo(ttft_s=0.5))
    core.waiting.push(ahead)
    late = wide("late", 1.0)
    assert forecast.wait_s(late) == pytest.approx(2.0, abs=0.05)  # both running jobs end
    assert forecast.refusal(late) is None  # cold: its error unknown, nothing refused

    def learn(ratio: float, count: int) -> None:
        for k in range(count):  # forecast 2 s (memory), started after 2 s x ratio
            job = wide(f"j{ratio}-{k}", 60.0)
            assert forecast.admit(job, [], 0, 10, set()) is None
            forecast.promises.started(job.job_id, now + 2.0 * ratio)

    # Under work-conserving admission, with jobs ahead the wait is one forecast of the work
    # ahead and the room together (a "queue" one); under peak admission the memory bound.
    memory = not lane.work_conserving
    learn(1.0, MIN_ERRORS)  # the forecast was right
    assert forecast.margin(memory=memory) == pytest.approx(1.0, abs=0.01)
    if lane.work_conserving:  # nothing ahead: the engine's to start, learned or not
        core.waiting.remove(ahead)
        assert forecast.refusal(wide("n", 1.0)) is None
        core.waiting.push(ahead)
    refusal = forecast.refusal(late)  # 2 s
    assert refusal is not None and refusal.cause == f"ttft:{'memory' if memory else 'queue'}"
    learn(0.2, MIN_ERRORS + 1)  # most starts 5x sooner than forecast
    assert forecast.margin(memory=memory) == pytest.approx(0.2, abs=0.01)
    assert forecast.margin(memory=not memory) == COLD_RATIO
    assert forecast.refusal(late) is None  # 0.4 s


@pytest.mark.asyncio
async def test_a_ratio_from_a_bad_spell_refuses_no_job_that_would_start_now() -> None:
    core = frozen_core()
    forecast = core.forecast
    now = core.now()
    core.lanes[0].running["r"] = new_job("r", 100, now)
    for k in range(MIN_ERRORS):
        job = new_job(f"j{k}", 5, now, slo=Slo(ttft_s=60.0))
        forecast.admit(job, [], 0, 10, set())
        forecast.promises.started(job.job_id, now + 30)  # 30x the forecast wait each
    assert forecast.refusal(new_job("n", 5, now, slo=Slo(ttft_s=5.0))) is not None
    del core.lanes[0].running["r"]  # the slot is free: it would start now
    assert forecast.refusal(new_job("n", 5, now, slo=Slo(ttft_s=0.5))) is None
    core.lanes[0].running["r"] = new_job("r", 100, now)
    assert forecast.margin() > COLD_RATIO
    forecast.now = lambda: now + ERROR_HORIZON_S + 31  # a quiet spell: nothing accepted
    assert forecast.refusal(new_job("n", 5, forecast.now(), slo=Slo(ttft_s=5.0))) is None
    assert forecast.margin() == COLD_RATIO  # lapsed: back to the prior
