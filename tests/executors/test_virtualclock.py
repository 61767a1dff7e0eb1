"""VirtualClockLoop: time jumps to the next timer, at any virtual time."""

from __future__ import annotations

import asyncio
import time

from daemon.executors.virtualclock import VirtualClockLoop


def test_timers_fire_without_sleeping_even_where_floats_are_coarse() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualClockLoop)
        loop.virtual_now = 3e7  # one float step here is ~4 ns, more than asyncio's resolution
        for _ in range(100):
            await asyncio.sleep(1e-10)
        await asyncio.sleep(3600.0)
        return loop.time()

    started = time.perf_counter()
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        now = runner.run(main())
    assert now >= 3e7 + 3600.0
    assert time.perf_counter() - started < 5.0
