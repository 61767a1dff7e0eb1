"""The executor: one long-lived task per device, the only way the core reaches an engine.

`run` takes commands from the executor's queue (Launch, Stop, Shutdown: daemon.core.events)
and reports what happens as events into the core's inbox: what its engine holds (Capacity:
KV blocks and batch cap, when the task starts and after each restart), a dispatch's first
output (Started), each engine step's tokens as one Tokens event, each dispatch's end
(Stopped, with the engine's finish reason; the core decides what it means for the job),
and its engine's health (EngineDown, EngineUp, EngineFailed). Tokens also go straight to the job's
output stream, so a client never waits for the core.

A subclass supplies the engine: `start`, `_begin` (start generating one dispatch),
`_halt` (a Stop arrived), `_drop_runs` (the engine failed), `_close_engine`, and, where an
engine can die, `engine_problem`, `engine_failure`, `restart_engine`. Per-request work
stays private inside it.

Health (what a separate supervisor did before): between commands the task checks its
engine every `health_check_interval_s`; an engine that is dead, raised an engine failure
while generating, or produced no token for `stall_timeout_s` with jobs admitted is taken out
of service. Its running jobs are reported stopped at once, with the tokens they already
streamed, so the core re-queues them and they resume (as after a preemption) once an engine
is up. The engine is restarted at once, then after a doubling backoff, up to
`restart_attempts` times since it last produced a token.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
from dataclasses import dataclass

import msgspec

from daemon.config import EngineConfig
from daemon.core.events import (
    Capacity,
    Command,
    EngineDown,
    EngineFailed,
    EngineUp,
    Event,
    Launch,
    Shutdown,
    Started,
    Stop,
    Stopped,
    Tokens,
)
from daemon.core.job import SamplingSpec, StopRequest
from daemon.core.stream import Position

log = logging.getLogger(__name__)


class EngineStats(msgspec.Struct, frozen=True, kw_only=True):
    """What the engine itself last reported (vLLM's scheduler stats), read by /metrics."""

    num_running_reqs: int = 0  # in the engine's running batch
    num_waiting_reqs: int = 0  # admitted by lengthwise but queued inside the engine
    kv_cache_usage: float = 0.0  # fraction of KV blocks in use, 0-1
    block_size: int = 0  # tokens per KV block
    num_gpu_blocks: int = 0  # KV blocks of the engine's cache (device memory or CPU)


class KVStoreTotals(msgspec.Struct, kw_only=True):
    """An engine's kvstore counters (kvstore.store.StoreCounters, as the connector reports
    them through vLLM's scheduler stats) since the executor started: tokens and bytes."""

    stored_bytes: int = 0  # held now (a gauge)
    saved_tokens: int = 0
    loaded_tokens: int = 0  # loaded into the engine instead of prefilled
    evicted_tokens: int = 0  # dropped from the store to stay within its budget
    load_failed_tokens: int = 0  # planned loads that failed: prefilled again

    def plus(self, other: KVStoreTotals) -> KVStoreTotals:
        """Totals over two engine lifetimes (an engine restart starts from zero); the
        gauge is the later one's."""
        return KVStoreTotals(
            stored_bytes=other.stored_bytes,
            saved_tokens=self.saved_tokens + other.saved_tokens,
            loaded_tokens=self.loaded_tokens + other.loaded_tokens,
            evicted_tokens=self.evicted_tokens + other.evicted_tokens,
            load_failed_tokens=self.load_failed_tokens + other.load_failed_tokens)


@dataclass(slots=True, eq=False)
class Run:
    """One dispatch of a job on this executor, from Launch to its Stopped report."""

    launch: Launch
    produced: int = 0  # tokens generated in this dispatch
    stop: StopRequest | None = None  # a Stop asked for it: end at the next token boundary
    offload: bool = False  # that Stop asked to save its KV to kvstore first
    engine: int = 0  # the executor's engine it began on (Executor.engine: 0, 1 after a restart)

    @property
    def job_id(self) -> str:
        return self.launch.job_id


class _EngineFailure(msgspec.Struct, frozen=True):
    """Posted to the executor's own queue by a generation that hit an engine failure."""

    why: str
    engine: int  # the engine that failed (Executor.engine when the generation began)


class Executor(abc.ABC):
    def __init__(self, name: str, inbox: asyncio.Queue[Event], engine: EngineConfig) -> None:
        self.name = name
        self.commands: asyncio.Queue[Command | _EngineFailure] = asyncio.Queue()
        self.config = engine
        self.down_reason: str | None = None  # why the engine is out of service; None = up
        self.failed = False  # restarts exhausted: down for good
        self.restarts = 0  # successful restarts, for /metrics and logs
        # The engine's own view as it last reported it; None until it did.
        self.reported_stats: EngineStats | None = None
        # Requests the engine itself preempted (its KV cache ran out), over every engine
        # this executor ran: vLLM's vllm:num_preemptions.
        self.engine_preemptions = 0
        self._inbox = inbox
        self._runs: dict[str, Run] = {}  # job id -> its dispatch here
        self._step: list[tuple[str, list[int]]] = []  # tokens not yet reported
        self._ends: list[Stopped] = []  # ends of runs whose last tokens are in _step
        self._flush_pending = False
        # Engines this executor took out of service so far: the running engine's number. A
        # failure reported by a generation of an earlier engine (vLLM's output task hands its
        # error to every request, some after the restart began) is stale.
        self.engine = 0
        # Restart attempts since the engine last produced a token: an engine that restarts
        # but never serves must not be restarted forever.
        self._attempts = 0
        self._progress = (0, 0)  # (launches, tokens) at the last health check
        self._launches = 0
        self._tokens = 0
        self._progress_time = 0.0

    # ---- the task -----------------------------------------------------------------------

    async def run(self) -> None:
        """The executor's one task: commands in, events out, health checks in between.
        Ends on Shutdown (or cancellation), leaving the engine to `shutdown`."""
        loop = asyncio.get_running_loop()
        self._progress_time = next_check = loop.time()
        self._report_capacity()
        try:
            while True:
                command = None
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(next_check - loop.time(), 0.0)):
                        command = await self.commands.get()
                if isinstance(command, Shutdown):
                    return
                if isinstance(command, _EngineFailure) and command.engine != self.engine:
                    command = None  # that engine was replaced since
                if command is not None:
                    self._handle(command)
                if isinstance(command, _EngineFailure) or loop.time() >= next_check:
                    next_check = loop.time() + self.config.health_check_interval_s
                    await self._check_health(loop.time(), command)
        finally:
            self._drop_runs()
            self._runs.clear()

    def _handle(self, command: Command | _EngineFailure) -> None:
        if isinstance(command, Launch):
            run = Run(command, engine=self.engine)
            self._runs[run.job_id] = run
            self._launches += 1
            if self.down_reason is not None:  # sent before the core heard it went down
                self._end_run(run, None)
            else:
                self._begin(run)
        elif isinstance(command, Stop):
            run_or_none = self._runs.get(command.job_id)
            if run_or_none is not None and (run_or_none.stop or 0) < command.why:
                run_or_none.stop, run_or_none.offload = command.why, command.offload
                self._halt(run_or_none)

    # ---- what subclasses call -----------------------------------------------------------

    def _started(self, run: Run, cached_tokens: int) -> None:
        """The dispatch's first output arrived; the engine had `cached_tokens` of its
        context (prompt + earlier output) cached."""
        launch = run.launch
        self._inbox.put_nowait(Started(
            self.name, run.job_id,
            len(launch.prompt_token_ids) + len(launch.generated_token_ids), cached_tokens))

    def _emit(self, run: Run, text: str, token_ids: list[int],
              logprobs: list[Position] | None = None) -> bool:
        """New output of a run, in order (`logprobs`: one position per token id, when asked
        for): to its stream now, to the core with its step. True: a stop string ended the
        job; stop generating and report "stop"."""
        run.produced += len(token_ids)
        self._tokens += len(token_ids)
        if token_ids:
            self._step.append((run.job_id, token_ids))
            if not self._flush_pending:  # one Tokens event for everything this step gave
                self._flush_pending = True
                asyncio.get_running_loop().call_soon(self._flush)
        return run.launch.stream.push(text, token_ids, logprobs)

    def _flush(self) -> None:
        self._flush_pending = False
        if self._step:
            step, self._step = self._step, []
            stats, now = self.engine_stats(), asyncio.get_running_loop().time()
            self._inbox.put_nowait(
                Tokens(self.name, now, step) if stats is None else
                Tokens(self.name, now, step, stats.kv_cache_usage, stats.num_waiting_reqs))
        ends, self._ends = self._ends, []
        for stopped in ends:
            self._inbox.put_nowait(stopped)

    def _end_run(self, run: Run, finish_reason: str | None, error: str | None = None,
                 kv_offloaded: bool = False) -> None:
        """The dispatch ended (the engine's finish reason; None: cut early). Once per run."""
        if self._runs.get(run.job_id) is not run:
            return
        del self._runs[run.job_id]
        stopped = Stopped(self.name, run.job_id, finish_reason, error, kv_offloaded)
        if self._flush_pending:  # its last tokens reach the core first, in their step's one
            self._ends.append(stopped)  # Tokens event (the core times steps by them)
        else:
            self._inbox.put_nowait(stopped)

    def _report_capacity(self) -> None:
        capacity = self.capacity()
        if capacity is not None:
            self._inbox.put_nowait(capacity)

    def _engine_failed(self, why: str, engine: int) -> None:
        """A generation on `engine` (its Run.engine) hit an engine failure: the task takes
        that engine out of service. Every running request reports it; the first report
        handled does, the others (and any from an engine already replaced) are then stale
        and change nothing."""
        if engine == self.engine:
            self.commands.put_nowait(_EngineFailure(why, engine))

    # ---- engine health ------------------------------------------------------------------

    async def _check_health(self, now: float, command: Command | _EngineFailure | None) -> None:
        if self.failed:
            return
        if self.down_reason is None:
            why = command.why if isinstance(command, _EngineFailure) else \
                self.engine_problem() or self._stalled(now)
            if why is None:
                return
            self._go_down(why)
        await self._recover(self.down_reason or "")
        self._progress_time = asyncio.get_running_loop().time()

    def _stalled(self, now: float) -> str | None:
        mark = (self._launches, self._tokens)
        if not self._runs or mark != self._progress:
            if self._runs and mark[1] > self._progress[1]:
                self._attempts = 0
            self._progress, self._progress_time = mark, now
            return None
        idle_s = now - self._progress_time
        limit = self.config.stall_timeout_s
        if limit and idle_s > limit:
            return f"no progress for {idle_s:.0f} s with {len(self._runs)} jobs admitted"
        return None

    def _go_down(self, why: str) -> None:
        """Take the engine out of service; its running jobs go back to the core at once."""
        log.error("executor %s is down: %s; %d running jobs go back to the queue",
                  self.name, why, len(self._runs))
        self.down_reason = why
        self.engine += 1  # the next engine's number: the failed one's reports are stale
        self._inbox.put_nowait(EngineDown(self.name, why))
        self._drop_runs()
        for run in list(self._runs.values()):
            self._end_run(run, None)

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
                        self.name, attempt, attempts, why)
            try:
                await asyncio.wait_for(self.restart_engine(), self.config.startup_timeout_s)
            except Exception as exc:  # noqa: BLE001 - every failure counts as one attempt
                log.error("executor %s: restart attempt %d failed: %r", self.name, attempt,
                          exc)
                continue
            self.restarts += 1
            self.down_reason = None
            log.info("executor %s is up again", self.name)
            self._report_capacity()
            self._inbox.put_nowait(EngineUp(self.name))
            return
        self.failed = True
        self.down_reason = (f"executor {self.name} could not be restarted after {attempts} "
                            f"attempts (down because: {why})")
        log.critical("%s", self.down_reason)
        self._inbox.put_nowait(EngineFailed(self.name, self.down_reason))

    # ---- the engine (subclasses) --------------------------------------------------------

    @abc.abstractmethod
    async def start(self) -> None:
        """Load and warm the engine; return when it can serve."""

    async def shutdown(self) -> None:
        """Stop the engine (after the task ended)."""
        self._drop_runs()
        self._runs.clear()
        await self._close_engine()

    @abc.abstractmethod
    async def _close_engine(self) -> None:
        """Stop the engine's processes and tasks."""

    @abc.abstractmethod
    def _begin(self, run: Run) -> None:
        """Start generating up to run.launch.max_new_tokens after the job's context, calling
        _emit per output and _end_run once at the end."""

    @abc.abstractmethod
    def _halt(self, run: Run) -> None:
        """A Stop arrived for `run` (run.stop is set): end it at its next token boundary."""

    @abc.abstractmethod
    def _drop_runs(self) -> None:
        """Forget every run's engine work without reporting (engine down, shutdown)."""

    def engine_problem(self) -> str | None:
        """Why the engine cannot serve now (dead, process gone); None when it looks fine."""
        return None

    def engine_failure(self, exc: BaseException) -> str | None:
        """Why `exc`, raised while generating, means the engine failed (not just one job)."""
        return None

    async def restart_engine(self) -> None:
        """Replace a failed engine with a fresh, warm one; raise if that fails."""
        raise NotImplementedError(f"executor {self.name} cannot restart its engine")

    def check_sampling(self, spec: SamplingSpec) -> None:
        """Raise ValueError (with `param` where it can name the field) when this engine
        would refuse `spec`; the HTTP layer asks before a job exists."""

    def capacity(self) -> Capacity | None:
        """What the running engine holds (KV blocks, batch cap); None if it cannot say."""
        return None

    def engine_stats(self) -> EngineStats | None:
        """What the engine last said about itself (read by /metrics at scrape time)."""
        return self.reported_stats

    def kvstore_totals(self) -> KVStoreTotals | None:
        """The engine's kvstore counters; None where no kvstore serves this executor."""
        return None
