from __future__ import annotations

import asyncio

import pytest

from daemon.config import SchedulerConfig, SimConfig
from daemon.core.events import Event
from daemon.core.job import Job, SamplingSpec
from daemon.core.lanes import Lane
from daemon.core.scheduler import Scheduler
from daemon.core.stream import OutputStream
from daemon.executors.sim import SimExecutor
from daemon.executors.virtualclock import VirtualClockLoop
from policies.fcfs import FCFS
from tests.support import read_to_end


async def _simulate(num_jobs: int, max_tokens: int) -> tuple[float, list[list[int]]]:
    cost = SimConfig()
    inbox: asyncio.Queue[Event] = asyncio.Queue()
    executors = [SimExecutor(f"sim{i}", inbox, cost) for i in range(2)]
    for ex in executors:
        await ex.start()
    scheduler = Scheduler([Lane(ex.name, ex.commands, 4) for ex in executors], FCFS(),
                          SchedulerConfig(max_running=4), inbox)
    scheduler.accepting = True
    tasks = [asyncio.create_task(scheduler.run())]
    tasks += [asyncio.create_task(ex.run()) for ex in executors]
    loop = asyncio.get_running_loop()
    streams = []
    for i in range(num_jobs):
        await asyncio.sleep(0.5)  # one arrival every 0.5 s of loop time
        job = Job(f"j{i}", [7, i], SamplingSpec(max_tokens=max_tokens, ignore_eos=True),
                  loop.time())
        streams.append(OutputStream())
        scheduler.submit(job, streams[-1])
    assert await scheduler.drain(timeout_s=10_000)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for ex in executors:
        await ex.shutdown()
    tokens = []
    for stream in streams:
        deltas, end = await read_to_end(stream, 1)
        assert end.finish_reason == "length"
        tokens.append([t for delta in deltas for t in delta.token_ids])
    return loop.time(), tokens


def test_virtual_clock_never_sleeps() -> None:
    """A minute of simulated serving (120 arrivals): every wait is a jump of the virtual
    clock, never a real sleep (how fast that runs is a benchmark's business, not a test's)."""
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        virtual_s, tokens = runner.run(_simulate(120, 200))
        loop = runner.get_loop()
        assert isinstance(loop, VirtualClockLoop)
    assert virtual_s >= 60
    assert loop.real_waits == 0
    assert loop.jumped_s == pytest.approx(virtual_s)  # all of it jumped over, none slept
    assert all(len(t) == 200 for t in tokens)


def test_tokens_are_deterministic() -> None:
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        first = runner.run(_simulate(5, 30))
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        second = runner.run(_simulate(5, 30))
    assert first == second


def test_step_time_follows_the_cost_model() -> None:
    cost = SimConfig(prefill_base_s=0.01, prefill_per_token_s=0.001, decode_base_s=0.02,
                     decode_per_seq_s=0.002, decode_per_context_token_s=0.0001)
    ex = SimExecutor("sim", asyncio.Queue(), cost)
    assert abs(ex.step_time_s(100, 4, 1000) - (0.01 + 0.1 + 0.02 + 0.008 + 0.1)) < 1e-12
    assert abs(ex.step_time_s(0, 1, 0) - 0.022) < 1e-12
