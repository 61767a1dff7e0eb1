"""Supervisor on the core and the simulated executor: an engine taken out of service hands
its jobs back with their tokens, they resume after the restart with the same output; a hung
engine is detected; restarts are bounded and then every waiting job ends with an error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from daemon.config import EngineConfig, SchedulerConfig, SimConfig
from daemon.core.job import Job, SamplingSpec
from daemon.core.scheduler import Scheduler
from daemon.executors.base import Executor
from daemon.executors.sim import SimExecutor
from daemon.executors.supervisor import Supervisor
from policies.fcfs import FCFS
from tests.core.test_scheduler import outputs

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
        self.failures: list[str] = []
        self.supervisor = Supervisor(executor, WATCH, self._on_failed)

    def _on_failed(self, executor: Executor, why: str) -> None:
        self.failures.append(why)
        self.scheduler.fail_waiting(why)

    def job(self, name: str, max_tokens: int) -> Job:
        return Job(name, [5, 6, 7], SamplingSpec(max_tokens=max_tokens, ignore_eos=True),
                   self.scheduler.now())


@pytest_asyncio.fixture
async def rig() -> AsyncIterator[Rig]:
    executor = SimExecutor("sim0", 2, FAST)
    await executor.start()
    scheduler = Scheduler([executor], FCFS(), SchedulerConfig(max_running=2))
    scheduler.accepting = True
    rig = Rig(executor, scheduler)
    tasks = [asyncio.create_task(scheduler.run()), asyncio.create_task(rig.supervisor.run())]
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
    whole = rig.job("whole", 120)
    rig.scheduler.submit(whole)
    expected, _ = await outputs(whole)

    cut = rig.job("cut", 120)
    rig.scheduler.submit(cut)
    await _until(lambda: cut.num_generated_tokens >= 30)
    rig.executor.mark_down("test: engine process gone")
    assert rig.executor.free_slots == 0 and not rig.executor.running
    assert cut in rig.scheduler.waiting  # back in the queue, tokens kept
    assert cut.num_generated_tokens >= 30
    ids, end = await outputs(cut)
    assert end.error is None and end.finish_reason == "length"
    assert ids == expected  # resumed where it stopped: the same 120 tokens
    assert rig.supervisor.restarts == 1 and rig.executor.down_reason is None


async def test_hung_engine_is_restarted_then_given_up(rig: Rig) -> None:
    rig.executor.cost = HUNG
    job = rig.job("stuck", 50)
    rig.scheduler.submit(job)
    ids, end = await outputs(job)
    assert ids == [] and end.finish_reason is None
    assert end.error is not None and "could not be restarted after 2 attempts" in end.error
    assert "no progress for" in end.error
    assert rig.supervisor.failed and len(rig.failures) == 1
    assert rig.executor.free_slots == 0
    assert not rig.scheduler.accepting  # new requests get 503 from now on


async def test_an_executor_marked_down_is_restarted_at_once() -> None:
    """No wait for the next health check (30 s here): the restart starts when the executor
    reports its engine dead."""
    executor = SimExecutor("sim0", 2, FAST)
    await executor.start()
    slow_checks = EngineConfig(health_check_interval_s=30.0, restart_attempts=1)
    supervisor = Supervisor(executor, slow_checks, lambda ex, why: None)
    task = asyncio.create_task(supervisor.run())
    try:
        await asyncio.sleep(0.05)
        executor.mark_down("the engine died")
        await _until(lambda: supervisor.restarts == 1, timeout_s=2.0)
        assert executor.down_reason is None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await executor.shutdown()
