"""Where the lanes' clocks fit (core/clock.py): in a worker thread in the daemon, so that
the core's loop never waits for a fit (~1 ms alone; 65 ms beside a thread busy in Python,
bench.clockfit; caught holding the loop for 1.3-3.0 s in the round's sweeps:
docs/results/2026-11-30-fit-stalls-and-ttft-by-parts.md), or inline, in order with the
events, where there is no worker (the simulator's virtual time and tests, deterministic).

A fit in the worker reads a copy of the clock's window and comes back as a Refitted event,
handled in order like any other; a lane has one fit in the worker at a time (one due
meanwhile is skipped: the next due one reads a fuller window)."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor

from daemon.core import clock
from daemon.core.events import Event, Refitted

log = logging.getLogger(__name__)


class Refits:
    def __init__(self, inbox: asyncio.Queue[Event], worker: Executor | None) -> None:
        self.inbox = inbox
        self.worker = worker
        self._busy: set[str] = set()  # lanes with a fit in the worker

    def due(self, name: str, lane_clock: clock.StepClock) -> bool:
        """The lane's clock has a fit due. True when it refitted here and now."""
        if self.worker is None:
            lane_clock.refit()
            return True
        if name not in self._busy:
            self._busy.add(name)
            work = asyncio.get_running_loop().run_in_executor(self.worker, clock.fit,
                                                              lane_clock.window())
            work.add_done_callback(lambda done: self._back(name, done))
        return False

    def _back(self, name: str, done: asyncio.Future[clock.Fit]) -> None:
        if done.cancelled():  # shutting down
            return
        error = done.exception()
        if error is not None:
            log.error("the clock fit of %s failed: %r", name, error)
        self.inbox.put_nowait(Refitted(name, None if error else done.result()))

    def adopt(self, event: Refitted, lane_clock: clock.StepClock) -> bool:
        """A fit came back. True when the lane's clock took it."""
        self._busy.discard(event.executor)
        return event.fit is not None and lane_clock.adopt(event.fit)
