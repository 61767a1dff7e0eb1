"""The daemon's event loop, watched. A probe on the loop measures how late a short timer
fires (the lag histogram in /metrics); a thread of its own notices when the loop has not
run for BLOCKED_S and logs where the loop's thread is at that moment (its Python stack),
once per block. A loop blocked that long holds every stream and every engine's outputs:
in ~60 benchmark runs of one session a single 3.2 s block was seen, with nothing in the
log to name its cause (docs/results/2026-11-29-three-draws-and-a-blocked-loop.md); the next
one names it."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable

log = logging.getLogger(__name__)
PROBE_S = 0.1  # period of the lag probe (and of the watcher's look)
BLOCKED_S = 1.0  # a loop that has not run this long is logged with its stack


class LoopWatch:
    """`await run()` on the loop to watch (cancel it to stop: the thread stops with it)."""

    def __init__(self, observe: Callable[[float], None], probe_s: float = PROBE_S,
                 blocked_s: float = BLOCKED_S) -> None:
        self.observe = observe  # each probe's lag, seconds
        self.probe_s, self.blocked_s = probe_s, blocked_s
        self.blocks = 0  # blocks logged
        self._beat = time.monotonic()  # the loop's last turn (written by the loop only)
        self._stop = threading.Event()
        self._loop_thread = threading.get_ident()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        watcher = threading.Thread(target=self._watch, name="loop-watch", daemon=True)
        self._stop.clear()
        watcher.start()
        try:
            while True:
                self._beat = time.monotonic()
                start = loop.time()
                await asyncio.sleep(self.probe_s)
                self.observe(max(loop.time() - start - self.probe_s, 0.0))
        finally:
            self._stop.set()
            watcher.join(timeout=1.0)

    def _watch(self) -> None:
        logged = None  # the beat whose block was logged: one line per block
        while not self._stop.wait(self.probe_s):
            beat = self._beat
            blocked = time.monotonic() - beat
            if blocked < self.blocked_s or beat == logged:
                continue
            logged = beat
            self.blocks += 1
            frame = sys._current_frames().get(self._loop_thread)
            where = "".join(traceback.format_stack(frame)) if frame else "(no frame)\n"
            log.warning("the event loop has not run for %.1f s (streams and engine outputs "
                        "wait); its thread is at:\n%s", blocked, where.rstrip())
