"""The daemon's event loop, watched. A probe on the loop measures how late a short timer
fires (the lag histogram in /metrics); a thread of its own notices when the loop has not
run for BLOCKED_S and logs where the loop's thread is at that moment (its Python stack),
once per block; and a garbage collection that takes longer than SLOW_GC_S is logged with
its generation and what it freed (a collection stops the thread it runs on, the loop's
most often, and its stack would name only the allocation that set it off). A loop blocked
that long holds every stream and every engine's outputs: in ~100 benchmark runs, blocks of
3.2 s and 0.65 s were seen with nothing in the log to name their cause
(docs/results/2026-11-29-three-draws-and-a-blocked-loop.md); the next one names it."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable

log = logging.getLogger(__name__)
PROBE_S = 0.1  # period of the lag probe (and of the watcher's look)
BLOCKED_S = 1.0  # a loop that has not run this long is logged with its stack
SLOW_GC_S = 0.1  # a garbage collection this long is logged


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
        self._gc_start = 0.0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        watcher = threading.Thread(target=self._watch, name="loop-watch", daemon=True)
        self._stop.clear()
        watcher.start()
        gc.callbacks.append(self._on_gc)
        try:
            while True:
                self._beat = time.monotonic()
                start = loop.time()
                await asyncio.sleep(self.probe_s)
                self.observe(max(loop.time() - start - self.probe_s, 0.0))
        finally:
            gc.callbacks.remove(self._on_gc)
            self._stop.set()
            watcher.join(timeout=1.0)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
            return
        took = time.perf_counter() - self._gc_start
        # Before start-up froze the heap (lifecycle: gc.freeze) a full collection walks all
        # of torch and vLLM: start-up's own, 0.5-0.6 s on the 2-core machine, not news.
        if took >= SLOW_GC_S and gc.get_freeze_count():
            log.warning("a garbage collection of generation %d took %.2f s on thread %s "
                        "(%d objects collected, %d uncollectable)", info["generation"], took,
                        threading.current_thread().name, info["collected"],
                        info["uncollectable"])

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
