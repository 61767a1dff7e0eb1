"""The executor's task on the core and the simulated engine: an engine taken out of service
hands its jobs back with their tokens, they resume after the restart with the same output; a
hung engine is detected; restarts are bounded and then every waiting job ends with an error;
commands for jobs it no longer runs change nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from daemon.config import EngineConfig, SchedulerConfig, SimConfig
from daemon.core.events import (
    Capacity,
    EngineDown,
    EngineUp,
    Event,
    Launch,
    Started,
    Stop,
    Stopped,
    Tokens,
)
from daemon.core.job import Job, SamplingSpec, StopRequest
from daemon.core.lanes import Lane
from daemon.core.scheduler import Scheduler
from daemon.core.stream import JobEnd, OutputStream
from daemon.executors.sim import SimExecutor
from policies.fcfs import FCFS
from tests.support import read_to_end

pytestmark = pytest.mark.asyncio

FAST = SimConfig(prefill_base_s=0.0005, prefill_per_token_s=0.0, decode_base_s=0.002,
                 decode_per_seq_s=0.0, decode_per_context_token_s=0.0)
HUNG = SimConfig(prefill_base_s=60.0, decode_base_s=60.0)  # no token within any test
WATCH = EngineConfig(health_check_interval_s=0.02, stall_timeout_s=0.2, restart_attempts=2,
                     restart_backoff_s=0.01, startup_timeout_s=5.0)


class Rig:
    def __init__(self, executor: SimExecutor, scheduler: Scheduler) -> None:
        self.executor = executor
        self.scheduler = scheduler
        self.streams: dict[str, OutputStream] = {}

    def submit(self, name: str, max_tokens: int) -> Job:
        job = Job(name, [5, 6, 7], SamplingSpec(max_tokens=max_tokens, ignore_eos=True),
                  self.scheduler.now())
        self.streams[name] = OutputStream()
        self.scheduler.submit(job, self.streams[name])
        return job

    async def outputs(self, job: Job) -> tuple[list[int], JobEnd]:
        deltas, end = await read_to_end(self.streams[job.job_id], 10)
        return [i for delta in deltas for i in delta.token_ids], end


@pytest_asyncio.fixture
async def rig() -> AsyncIterator[Rig]:
    inbox: asyncio.Queue[Event] = asyncio.Queue()
    executor = SimExecutor("sim0", inbox, FAST, WATCH)
    await executor.start()
    scheduler = Scheduler([Lane("sim0", executor.commands, 2)], FCFS(),
                          SchedulerConfig(max_running=2), inbox)
    scheduler.accepting = True
    rig = Rig(executor, scheduler)
    tasks = [asyncio.create_task(scheduler.run()), asyncio.create_task(executor.run())]
    yield rig
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await executor.shutdown()


async def _until(condition: object, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.005)


async def test_down_engine_hands_jobs_back_and_they_resume(rig: Rig) -> None:
    whole = rig.submit("whole", 120)
    expected, _ = await rig.outputs(whole)

    cut = rig.submit("cut", 120)
    await _until(lambda: cut.num_generated_tokens >= 30)
    lane = rig.scheduler.lanes[0]
    rig.executor.restart_engine = _slow(rig.executor.restart_engine)  # type: ignore[method-assign]
    # as a generation reports it
    rig.executor._engine_failed("test: engine process gone", rig.executor.engine)
    await _until(lambda: lane.down_reason is not None)
    await _until(lambda: cut in rig.scheduler.waiting)  # back in the queue, tokens kept
    assert lane.free_slots == 0 and not lane.running
    assert cut.num_generated_tokens >= 30
    ids, end = await rig.outputs(cut)
    assert end.error is None and end.finish_reason == "length"
    assert ids == expected  # resumed where it stopped: the same 120 tokens
    assert rig.executor.restarts == 1 and rig.executor.down_reason is None
    assert lane.down_reason is None


async def test_hung_engine_is_restarted_then_given_up(rig: Rig) -> None:
    rig.executor.cost = HUNG
    job = rig.submit("stuck", 50)
    ids, end = await rig.outputs(job)
    assert ids == [] and end.finish_reason is None
    assert end.error is not None and "could not be restarted after 2 attempts" in end.error
    assert "no progress for" in end.error
    assert rig.executor.failed and rig.scheduler.failed.is_set()
    assert rig.scheduler.lanes[0].free_slots == 0
    assert not rig.scheduler.accepting  # new requests get 503 from now on


async def test_an_executor_marked_down_is_restarted_at_once() -> None:
    """No wait for the next health check (30 s here): the restart starts when a generation
    reports its engine dead."""
    inbox: asyncio.Queue[Event] = asyncio.Queue()
    slow_checks = EngineConfig(health_check_interval_s=30.0, restart_attempts=1)
    executor = SimExecutor("sim0", inbox, FAST, slow_checks)
    await executor.start()
    task = asyncio.create_task(executor.run())
    try:
        await asyncio.sleep(0.05)
        executor._engine_failed("the engine died", executor.engine)
        await _until(lambda: executor.restarts == 1, timeout_s=2.0)
        assert executor.down_reason is None
        # What the engine holds when the task starts and again once it is back, then up.
        assert [type(e) for e in inbox._queue] == [  # type: ignore[attr-defined]
            Capacity, EngineDown, Capacity, EngineUp]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await executor.shutdown()


async def test_one_engine_failure_reported_by_every_run_restarts_once() -> None:
    """Every running request sees the engine fail; the engine is restarted once, not once
    per report (a report handled after the restart would take the new engine down)."""
    inbox: asyncio.Queue[Event] = asyncio.Queue()
    executor = SimExecutor("sim0", inbox, FAST, EngineConfig(health_check_interval_s=30.0))
    await executor.start()
    task = asyncio.create_task(executor.run())
    try:
        await asyncio.sleep(0.05)
        for _ in range(3):
            executor._engine_failed("the engine died", executor.engine)
        await _until(lambda: executor.restarts == 1, timeout_s=2.0)
        await asyncio.sleep(0.2)
        assert executor.restarts == 1 and executor.down_reason is None
        assert sum(isinstance(e, EngineDown) for e in inbox._queue) == 1  # type: ignore[attr-defined]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await executor.shutdown()


async def test_a_failure_reported_by_the_old_engine_during_the_restart_is_stale() -> None:
    """A dead engine's requests report its failure, and those reports may be handled after
    the engine was replaced (the engine kill test once counted two restarts for one death:
    the health check found the engine dead first, and the report its stream had queued took
    the new engine down): they must change nothing, a report of the new engine must."""
    inbox: asyncio.Queue[Event] = asyncio.Queue()
    executor = SimExecutor("sim0", inbox, FAST, EngineConfig(health_check_interval_s=30.0,
                                                             restart_backoff_s=0.01))
    await executor.start()
    executor.restart_engine = _slow(executor.restart_engine)  # type: ignore[method-assign]
    task = asyncio.create_task(executor.run())
    try:
        await asyncio.sleep(0.05)
        old = executor.engine
        executor._engine_failed("the engine died", old)
        await _until(lambda: executor.down_reason is not None)
        executor._engine_failed("the engine died (a late report)", old)  # while restarting
        await _until(lambda: executor.restarts == 1, timeout_s=2.0)
        await asyncio.sleep(0.2)
        assert executor.restarts == 1 and executor.down_reason is None
        assert executor.engine == old + 1
        executor._engine_failed("the new engine died", executor.engine)  # a real one counts
        await _until(lambda: executor.restarts == 2, timeout_s=2.0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await executor.shutdown()


async def test_reports_come_in_order_and_stale_commands_change_nothing() -> None:
    """Started, then one Tokens event per step, then Stopped; a Stop for a job it does not
    run is ignored; an abort ends a run at once; a launch while down is handed back."""
    inbox: asyncio.Queue[Event] = asyncio.Queue()
    executor = SimExecutor("sim0", inbox, FAST, WATCH)
    await executor.start()
    task = asyncio.create_task(executor.run())

    def launch(job_id: str, max_new_tokens: int) -> Launch:
        return Launch(job_id=job_id, dispatch=1, prompt_token_ids=[1, 2],
                      generated_token_ids=[], sampling=SamplingSpec(max_tokens=max_new_tokens,
                                                                    ignore_eos=True),
                      max_new_tokens=max_new_tokens, engine_priority=0, stream=OutputStream())

    async def next_event() -> Event:
        return await asyncio.wait_for(inbox.get(), 5)

    try:
        assert await next_event() == Capacity("sim0", 8192, 16, 8)  # first: what it holds
        executor.commands.put_nowait(Stop("nobody", StopRequest.ABORT))
        executor.commands.put_nowait(launch("a", 3))
        events = [await next_event() for _ in range(5)]
        assert [type(e) for e in events] == [Started, Tokens, Tokens, Tokens, Stopped]
        assert all(e.items == [("a", [e.items[0][1][0]])] for e in events[1:4])  # type: ignore[union-attr]
        assert events[-1] == Stopped("sim0", "a", "length")
        executor.commands.put_nowait(launch("b", 1000))
        assert isinstance(await next_event(), Started)
        executor.commands.put_nowait(Stop("b", StopRequest.ABORT))
        while not isinstance(event := await next_event(), Stopped):
            assert isinstance(event, Tokens)
        assert event == Stopped("sim0", "b", None)
        executor.down_reason = "test"  # as if the core had not heard yet
        executor.commands.put_nowait(launch("c", 5))
        assert await next_event() == Stopped("sim0", "c", None)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await executor.shutdown()


def _slow(restart):  # type: ignore[no-untyped-def]
    """A restart that takes a moment, so the test sees the engine down."""
    async def slower() -> None:
        await asyncio.sleep(0.05)
        await restart()
    return slower
