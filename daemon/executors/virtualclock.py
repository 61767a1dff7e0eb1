"""An asyncio loop whose clock jumps instead of sleeping, for the simulator.

When nothing is ready, the selector would sleep until the next timer; here it advances the
loop's virtual clock to that timer instead. The real core and policies run unchanged on it,
so a 10-minute trace simulates in seconds. Real I/O still works (thread pools wake the loop
through its self-pipe), but time spent in threads is not counted: predictions are free.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any


class _JumpingSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    def __init__(self) -> None:
        super().__init__()
        self.clock: VirtualClockLoop | None = None

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None or self.clock is None:
            if self.clock is not None:
                self.clock.real_waits += 1
            return super().select(timeout)  # nothing scheduled: wait for real I/O
        self.clock.virtual_now += timeout
        self.clock.jumped_s += timeout
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        selector = _JumpingSelector()
        self.virtual_now = 0.0  # seconds since the loop was made
        self.jumped_s = 0.0  # virtual seconds the clock jumped instead of sleeping
        self.real_waits = 0  # times the loop blocked on real I/O (nothing was scheduled)
        super().__init__(selector)
        selector.clock = self
        # Timers due within this are run: asyncio's default (the monotonic clock's 1 ns) is
        # below one float step of a virtual clock past ~1e7 s, where a timer set a hair
        # ahead could then never come due and the loop would spin. 1 us is far below any
        # simulated cost.
        self._clock_resolution = 1e-6

    def time(self) -> float:
        return self.virtual_now
