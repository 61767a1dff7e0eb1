"""Supervisor: watches one executor's engine, takes it out of service when it dies or hangs,
and restarts it with bounded retries and backoff.

Detection: the executor's own check (vLLM: engine-dead flag, set when the engine process
exits), an engine-failure error raised while generating (the executor marks itself down),
or no new token for `stall_timeout_s` while jobs are admitted. While down the executor
offers no slot; its jobs wait in the core and resume when it (or another) is up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from daemon.executors.base import Executor
from daemon.executors.settings import EngineConfig

log = logging.getLogger(__name__)

OnFailed = Callable[[Executor, str], None]  # executor, why it could not be restarted


class Supervisor:
    def __init__(self, executor: Executor, config: EngineConfig, on_failed: OnFailed) -> None:
        self.executor = executor
        self.config = config
        self.on_failed = on_failed
        self.failed = False  # restarts exhausted: the executor stays down
        self.restarts = 0  # successful restarts, for /metrics and logs
        # Restart attempts since the engine last produced a token: an engine that restarts
        # but never serves must not be restarted forever.
        self._attempts = 0
        # (dispatches, tokens generated in this dispatch) summed over running jobs
        self._progress: tuple[int, int] = (0, 0)
        self._progress_time = 0.0
        # Set when the executor marks itself down (an engine error while generating): the
        # restart starts at once, not at the next health check.
        self._down = asyncio.Event()
        executor.on_down = self._down.set

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._progress_time = loop.time()
        while not self.failed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._down.wait(), self.config.health_check_interval_s)
            self._down.clear()
            ex = self.executor
            if ex.down_reason is None:
                why = ex.engine_problem() or self._stalled(loop.time())
                if why is not None:
                    ex.mark_down(why)
            if ex.down_reason is not None:
                await self._recover(ex.down_reason)
                self._progress_time = loop.time()

    def _stalled(self, now: float) -> str | None:
        running = self.executor.running.values()
        mark = (sum(job.num_dispatches for job in running),
                sum(job.num_generated_tokens - job.tokens_at_dispatch for job in running))
        if not running or mark != self._progress:
            if running and mark[1] > self._progress[1]:
                self._attempts = 0
            self._progress, self._progress_time = mark, now
            return None
        idle_s = now - self._progress_time
        limit = self.config.stall_timeout_s
        if limit and idle_s > limit:
            return f"no progress for {idle_s:.0f} s with {len(running)} jobs admitted"
        return None

    async def _recover(self, why: str) -> None:
        """Restart the engine; first at once, then after a doubling backoff. Attempts count
        until the engine serves a token again, across successive failures."""
        attempts = self.config.restart_attempts
        while self._attempts < attempts:
            self._attempts += 1
            attempt = self._attempts
            if attempt > 1:
                await asyncio.sleep(self.config.restart_backoff_s * 2 ** (attempt - 2))
            log.warning("executor %s: restarting its engine (attempt %d of %d) after: %s",
                        self.executor.name, attempt, attempts, why)
            try:
                await asyncio.wait_for(self.executor.restart_engine(),
                                       self.config.startup_timeout_s)
            except Exception as exc:  # noqa: BLE001 - every failure counts as one attempt
                log.error("executor %s: restart attempt %d failed: %r", self.executor.name,
                          attempt, exc)
                continue
            self.restarts += 1
            self.executor.mark_up()
            return
        self.failed = True
        message = (f"executor {self.executor.name} could not be restarted after {attempts} "
                   f"attempts (down because: {why})")
        self.executor.down_reason = message
        log.critical("%s", message)
        self.on_failed(self.executor, message)
