"""An executor's running totals of predicted work (daemon.core.work) against the sums they
replace, after any sequence of launches, tokens, finishes, preemptions, re-predictions and
engine failures, driven through the real Executor base class."""

from __future__ import annotations

import asyncio
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.core.costmodel import CostModel
from daemon.core.job import Job, SamplingSpec, StopRequest
from daemon.core.policy import Policy
from daemon.core.work import RunningWork, job_work
from daemon.executors.base import Executor, Outcome

COST = CostModel(decode_base_s=0.02, decode_per_seq_s=0.001, decode_per_context_token_s=3e-6)


class Manual(Executor):
    """Generates what the test feeds it: n tokens per command, "end" to finish."""

    def __init__(self, name: str) -> None:
        super().__init__(name, max_running=3)
        self.feeds: dict[str, asyncio.Queue[int | str]] = {}

    async def start(self) -> None:
        pass

    async def shutdown(self) -> None:
        pass

    async def _generate(self, job: Job, max_new_tokens: int, engine_priority: int) -> str | None:
        feed = self.feeds[job.job_id] = asyncio.Queue()
        made = 0
        while True:
            cmd = await feed.get()
            if cmd == "end":
                return "stop"
            n = min(int(cmd), max_new_tokens - made)
            made += n
            job.emit("x" * n, [5] * n, 0.0)
            if job.stop_request is not None:
                return None
            if made >= max_new_tokens:
                return "length"


predictions = st.one_of(st.none(), st.floats(0.0, 3000.0), st.integers(0, 3000).map(float))
ops = st.lists(st.one_of(
    st.tuples(st.just("launch"), st.integers(0, 2), st.integers(1, 400), predictions,
              st.integers(1, 600)),
    st.tuples(st.just("tokens"), st.integers(0, 20), st.integers(1, 40)),
    st.tuples(st.just("finish"), st.integers(0, 20)),
    st.tuples(st.just("preempt"), st.integers(0, 20)),
    st.tuples(st.just("repredict"), st.integers(0, 20), predictions),
    st.tuples(st.just("down"), st.integers(0, 2)),
), max_size=40)


def recomputed(ex: Executor) -> tuple[float, float]:
    shares = [job_work(job) for job in ex.running.values()]
    return sum(s[0] for s in shares), sum(s[1] for s in shares)


def check(executors: list[Executor], exact: bool) -> None:
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
    executors = [Manual(f"e{i}") for i in range(3)]
    waiting: list[Job] = []  # preempted or evicted jobs, resumable
    for ex in executors:
        ex.on_stop = lambda job, outcome, _: waiting.append(job) if (
            outcome is Outcome.YIELDED) else None

    def running() -> list[tuple[Executor, Job]]:
        return [(ex, job) for ex in executors for job in ex.running.values()]

    def pick(i: int) -> tuple[Executor, Job] | None:
        jobs = running()
        return jobs[i % len(jobs)] if jobs else None

    for n, step in enumerate(steps):
        kind = step[0]
        if kind == "launch":
            _, e, prompt, predicted, max_tokens = step
            ex = executors[e]
            if ex.free_slots:
                if waiting:
                    job = waiting.pop(0)
                else:
                    job = Job(f"j{n}", [1] * prompt, SamplingSpec(max_tokens=max_tokens), 0.0,
                              predicted_output_tokens=predicted)
                ex.launch(job, None, 0)
        elif kind in ("tokens", "finish", "preempt") and (hit := pick(step[1])):
            ex, job = hit
            if job.job_id in ex.feeds:
                if kind == "preempt":
                    ex.request_stop(job, StopRequest.PREEMPT)
                ex.feeds[job.job_id].put_nowait(step[2] if kind == "tokens" else
                                                "end" if kind == "finish" else 1)
        elif kind == "repredict" and (hit := pick(step[1])):
            hit[1].set_prediction(step[2])
        elif kind == "down":
            executors[step[1]].mark_down("test")
            executors[step[1]].mark_up()
        for _ in range(4):  # let the job tasks take their commands
            await asyncio.sleep(0)
        check(executors, exact)
    for ex in executors:
        await ex.stop_all_tasks()
    check(executors, exact)
    assert all(ex.load() == 0.0 and ex.context_reads() == 0.0 for ex in executors)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_running_totals_equal_the_sums(steps: list[tuple]) -> None:
    asyncio.run(replay(steps, exact=False))


@settings(max_examples=100, deadline=None)
@given(ops.map(lambda steps: [
    (*s[:3], None if s[3] is None else float(math.floor(s[3])), s[4]) if s[0] == "launch"
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
    a.predicted_output_tokens = 50.3  # no executor hooked: the total does not follow
    work.update(a)
    assert work.tokens == pytest.approx(51.3)
    work.remove(a)
    work.remove(b)
    work.remove(b)
    assert (work.tokens, work.context_reads, len(work)) == (0.0, 0.0, 0)
