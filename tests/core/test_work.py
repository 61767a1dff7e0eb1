"""An executor's running totals of predicted work (daemon.core.work, kept on the core's
lanes) against the sums they replace, after any sequence of arrivals, tokens, finishes,
preemptions, re-predictions and engine failures, driven through the real core's inbox."""

from __future__ import annotations

import asyncio
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.config import SchedulerConfig
from daemon.core.costmodel import CostModel
from daemon.core.events import EngineDown, EngineUp, Event, Predicted, Stopped, Tokens
from daemon.core.job import Job, SamplingSpec
from daemon.core.lanes import Lane
from daemon.core.policy import Policy
from daemon.core.scheduler import Scheduler
from daemon.core.stream import OutputStream
from daemon.core.work import RunningWork, job_work
from policies.fcfs import FCFS

COST = CostModel(decode_base_s=0.02, decode_per_seq_s=0.001, decode_per_context_token_s=3e-6)


predictions = st.one_of(st.none(), st.floats(0.0, 3000.0), st.integers(0, 3000).map(float))
ops = st.lists(st.one_of(
    st.tuples(st.just("submit"), st.integers(0, 2), st.integers(1, 400), predictions,
              st.integers(1, 600)),
    st.tuples(st.just("tokens"), st.integers(0, 20), st.integers(1, 40)),
    st.tuples(st.just("finish"), st.integers(0, 20)),
    st.tuples(st.just("preempt"), st.integers(0, 20)),  # cut early: back to the queue
    st.tuples(st.just("repredict"), st.integers(0, 20), predictions),
    st.tuples(st.just("down"), st.integers(0, 2)),
), max_size=40)


def recomputed(ex: Lane) -> tuple[float, float]:
    shares = [job_work(job) for job in ex.running.values()]
    return sum(s[0] for s in shares), sum(s[1] for s in shares)


def check(executors: list[Lane], exact: bool) -> None:
    for ex in executors:
        tokens, reads = recomputed(ex)
        assert len(ex.work) == len(ex.running)
        if exact:  # whole-number predictions: every sum is exact in floats
            assert (ex.load(), ex.context_reads()) == (tokens, reads)
        else:
            assert ex.load() == pytest.approx(tokens, rel=1e-9, abs=1e-6)
            assert ex.context_reads() == pytest.approx(reads, rel=1e-9, abs=1e-3)
        # ALISE's remaining time of the executor, from the totals, is the sum it replaces.
        alise = sum(COST.decode_share_s(j.num_prompt_tokens + j.num_generated_tokens,
                                        j.predicted_remaining_tokens, 4)
                    for j in ex.running.values())
        assert COST.decode_total_s(ex.load(), ex.context_reads(), 4) == pytest.approx(
            alise, rel=1e-9, abs=1e-9)
    if exact:  # the placement picks what the sum over the running jobs picks
        free = [ex for ex in executors if ex.free_slots > 0]
        if free:
            by_sum = min(free, key=lambda ex: (recomputed(ex)[0], len(ex.running)))
            assert Policy().own_executor(Job("probe", [1], SamplingSpec(max_tokens=1), 0.0),
                                         free) is by_sum


async def replay(steps: list[tuple], exact: bool) -> None:
    inbox: asyncio.Queue[Event] = asyncio.Queue()
    lanes = [Lane(f"e{i}", asyncio.Queue(), 3) for i in range(3)]  # commands are dropped
    core = Scheduler(lanes, FCFS(), SchedulerConfig(max_running=3, max_waiting=10_000), inbox)
    core.accepting = True

    def pick(i: int) -> tuple[Lane, Job] | None:
        jobs = [(lane, job) for lane in lanes for job in lane.running.values()]
        return jobs[i % len(jobs)] if jobs else None

    for n, step in enumerate(steps):
        kind, hit = step[0], pick(step[1])
        if kind == "submit":
            _, _, prompt, predicted, max_tokens = step
            core.submit(Job(f"j{n}", [1] * prompt, SamplingSpec(max_tokens=max_tokens), 0.0,
                            predicted_output_tokens=predicted), OutputStream())
        elif kind == "tokens" and hit:
            lane, job = hit
            count = min(step[2], job.num_remaining_budget_tokens)
            inbox.put_nowait(Tokens(lane.name, 0.0, [(job.job_id, [5] * count)]))
        elif kind in ("finish", "preempt") and hit:
            lane, job = hit
            inbox.put_nowait(Stopped(lane.name, job.job_id, "stop" if kind == "finish" else None))
        elif kind == "repredict" and hit and step[2] is not None:
            inbox.put_nowait(Predicted(hit[1].job_id, step[2], revised=True))
        elif kind == "down":
            lane = lanes[step[1]]
            inbox.put_nowait(EngineDown(lane.name, "test"))
            for job_id in lane.running:
                inbox.put_nowait(Stopped(lane.name, job_id, None))
            inbox.put_nowait(EngineUp(lane.name))
        while not inbox.empty():
            core.handle(inbox.get_nowait())
        core.dispatch()
        check(lanes, exact)
    for lane in lanes:
        for job_id in list(lane.running):
            core.handle(Stopped(lane.name, job_id, "stop"))
    check(lanes, exact)
    assert all(lane.load() == 0.0 and lane.context_reads() == 0.0 for lane in lanes)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_running_totals_equal_the_sums(steps: list[tuple]) -> None:
    asyncio.run(replay(steps, exact=False))


@settings(max_examples=100, deadline=None)
@given(ops.map(lambda steps: [
    (*s[:3], None if s[3] is None else float(math.floor(s[3])), s[4]) if s[0] == "submit"
    else (s[0], s[1], None if s[2] is None else float(math.floor(s[2])))
    if s[0] == "repredict" else s for s in steps]))
def test_placement_by_running_total_is_the_sums_choice(steps: list[tuple]) -> None:
    asyncio.run(replay(steps, exact=True))


def test_a_job_counts_once_and_an_empty_total_is_zero() -> None:
    work = RunningWork()
    a = Job("a", [1] * 10, SamplingSpec(max_tokens=100), 0.0, predicted_output_tokens=0.1)
    b = Job("b", [1] * 10, SamplingSpec(max_tokens=100), 0.0, predicted_output_tokens=0.2)
    work.add(a)
    work.add(a)
    work.add(b)
    assert len(work) == 2 and work.tokens == 2.0  # at least one token each
    a.predicted_output_tokens = 50.3  # the total follows only when told
    work.update(a)
    assert work.tokens == pytest.approx(51.3)
    work.remove(a)
    work.remove(b)
    work.remove(b)
    assert (work.tokens, work.context_reads, len(work)) == (0.0, 0.0, 0)
