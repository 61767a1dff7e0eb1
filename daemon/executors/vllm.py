"""VLLMExecutor: one vLLM V1 AsyncLLM engine (how it is built: vllm_engine.py).

Preemption is abort + resume: the engine request is aborted at a token boundary, the job
keeps its generated ids, and the next dispatch submits prompt + generated ids with the
remaining budget. With prefix caching on, the resumed prefill mostly hits cached blocks.
Each dispatch is one engine request whose outputs vLLM's own output task hands to the
executor (see "dispatches" below): no task per request reads them.
What makes a resume exact: penalties count the carried tokens (vllm_penalties.py), stop
strings are checked by the job's output stream over all its text (core/stream.py), seeded
samples are never preempted (Job.resumes_exactly); the dispatch's SamplingParams and what
carries over are in vllm_params.py.

With [kvstore] enabled, the engine loads lengthwise's KV connector (kvstore/): every request
is submitted asking the connector to consult the daemon when it ends, and a job preempted
with KV residency OFFLOAD is marked in the engine's decisions folder just before its abort
(kvstore/decisions.py), so the connector saves its blocks; its resume loads them. An engine
that cannot start or warm up with the connector runs without it (logged once).

The engine runs in its own process (EngineCore). When that process dies, vLLM flags the
client dead and every stream raises EngineDeadError: the executor then takes the engine out
of service and replaces it with a fresh one (see base.py).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from typing import Any

import msgspec

from daemon.config import Config
from daemon.core.events import Capacity, Event
from daemon.core.job import SamplingSpec, StopRequest
from daemon.executors import enginefork, spawn, vllm_engine, vllm_params
from daemon.executors.base import Executor, KVStoreTotals, Run
from kvstore import decisions

log = logging.getLogger(__name__)


class VLLMExecutor(Executor):
    def __init__(self, name: str, device: str, config: Config,
                 inbox: asyncio.Queue[Event]) -> None:
        super().__init__(name, inbox, config.engine)
        self.device = device
        self._config = config
        self._engine: Any = None
        self._building: asyncio.Future[Any] | None = None
        # kvstore: on until an engine failed to start with it, or died with it too often
        # (kvstore.max_engine_failures); its decisions folder.
        self._kvstore = config.kvstore.enabled
        self._kvstore_failures = 0  # engine failures (deaths, hangs) with the connector loaded
        self._decisions_dir: str | None = None
        self._kvstore_before = KVStoreTotals()  # totals of engines this executor replaced
        self._kvstore_now = KVStoreTotals()  # the current engine's, as last reported
        self._adding: dict[str, asyncio.Task[None]] = {}  # job id -> its request being added
        self._requests: dict[str, _Request] = {}  # job id -> its live engine request
        self._aborting: set[asyncio.Task[None]] = set()  # engine aborts under way

    @property
    def kvstore_active(self) -> bool:
        """Whether the running engine has lengthwise's KV connector."""
        return self._kvstore and self._engine is not None

    def _kv_transfer_config(self) -> Any:
        if self._decisions_dir is None:
            self._decisions_dir = tempfile.mkdtemp(prefix=f"lengthwise-kvstore-{self.name}-")
        return vllm_engine.kv_transfer_config(self._config.kvstore, self._decisions_dir)

    async def start(self) -> None:
        """Build the engine in a worker thread (the loop keeps serving while it loads: health,
        other executors' streams, the watchdog; other executors build theirs at the same
        time), then warm it up. vLLM starts its output task lazily, on the loop."""
        if self._kvstore:
            try:
                await self._start_engine(kvstore=True)
                log.info("executor %s ready on %s, with kvstore", self.name, self.device)
                return
            except Exception as exc:  # noqa: BLE001 - without kvstore beats not serving
                log.warning("executor %s: the engine cannot run with kvstore (%s: %s); it "
                            "runs without it: preempted jobs recompute on resume",
                            self.name, type(exc).__name__, exc)
                self._kvstore = False
                self._stop_engine()
        await self._start_engine(kvstore=False)
        log.info("executor %s ready on %s", self.name, self.device)

    async def _start_engine(self, kvstore: bool) -> None:
        self._building = asyncio.ensure_future(asyncio.to_thread(
            spawn.build_with_env, vllm_engine.engine_env(self._config, self.device),
            lambda: self._build_engine(kvstore),
            self._forks()))
        # shield: a start cancelled half-way leaves the build to finish, so that shutdown()
        # can stop the engine it gives.
        self._engine = await asyncio.shield(self._building)
        if not hasattr(getattr(self._engine, "output_processor", None), "request_states"):
            # _submit takes over requests' outputs there (vLLM 0.32's OutputProcessor)
            raise RuntimeError("this vLLM's AsyncLLM has no output_processor.request_states")
        await self._warm_up()

    def _forks(self) -> bool:
        """Whether this engine's processes start from the warm forkserver (enginefork)."""
        return not self.device.startswith("cuda") and \
            self._config.engine.start_method == "forkserver"

    def _build_engine(self, kvstore: bool) -> Any:
        from vllm.v1.engine.async_llm import AsyncLLM

        if self._forks():
            enginefork.use_forkserver()
        elif not self.device.startswith("cuda"):
            enginefork.use_spawn()

        kv_transfer = self._kv_transfer_config() if kvstore else None
        return AsyncLLM.from_engine_args(
            vllm_engine.engine_args(self._config, self.device, kv_transfer),
            stat_loggers=[self._stats_recorder])

    def _stats_recorder(self, vllm_config: Any, engine_index: int) -> Any:
        """vLLM's per-engine stat-logger factory signature."""
        return vllm_engine.StatsRecorder(self, vllm_config, self.name)

    async def _warm_up(self) -> None:
        """One short generation so the first client does not pay for lazy init."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=2, temperature=0.0)
        async for _ in self._engine.generate(TokensPrompt(prompt_token_ids=[1, 2, 3]), params,
                                             f"warmup-{self.name}"):
            pass

    async def _close_engine(self) -> None:
        for task in self._aborting:  # the engine goes: its requests with it
            task.cancel()
        building = self._building
        if self._engine is None and building is not None and not building.done():
            # Stopped while the engine loads: stop it as soon as it exists.
            building.add_done_callback(
                lambda done: done.cancelled() or done.exception() or done.result().shutdown())
        self._stop_engine()
        if self._decisions_dir is not None:
            shutil.rmtree(self._decisions_dir, ignore_errors=True)
            self._decisions_dir = None

    def _stop_engine(self) -> None:
        if self._engine is not None:
            engine, self._engine = self._engine, None
            engine.shutdown()

    def check_sampling(self, spec: SamplingSpec) -> None:
        if self._engine is not None:
            vllm_params.check(spec, self._engine)

    def capacity(self) -> Capacity | None:
        """The engine's KV blocks (less the one vLLM keeps as its null block) and its
        batch cap, as the engine sized them at start."""
        stats, engine = self.reported_stats, self._engine
        if stats is None or engine is None or stats.num_gpu_blocks <= 1:
            return None
        max_num_seqs = int(engine.vllm_config.scheduler_config.max_num_seqs)
        return Capacity(self.name, stats.num_gpu_blocks - 1, stats.block_size, max_num_seqs)

    def engine_problem(self) -> str | None:
        if self._engine is not None and self._engine.errored:
            return "the vLLM engine is dead (EngineCore process gone or failed)"
        return None

    def engine_failure(self, exc: BaseException) -> str | None:
        from vllm.v1.engine.exceptions import EngineDeadError

        if isinstance(exc, EngineDeadError):
            return f"the vLLM engine is dead ({type(exc).__name__})"
        return self.engine_problem()

    async def restart_engine(self) -> None:
        if self.kvstore_active:  # the engine that failed had the connector
            self._kvstore_failures += 1
            limit = self._config.kvstore.max_engine_failures
            if limit and self._kvstore_failures >= limit:
                log.warning("executor %s: its engine failed %d times with kvstore loaded; it "
                            "restarts without it: preempted jobs recompute on resume "
                            "(kvstore.max_engine_failures)", self.name, self._kvstore_failures)
                self._kvstore = False
        self._stop_engine()
        # The new engine's store starts empty and counts from zero.
        self._kvstore_before = self._kvstore_before.plus(self._kvstore_now)
        self._kvstore_now = KVStoreTotals()
        await self.start()

    # ---- kvstore ------------------------------------------------------------------------

    def kvstore_reported(self, data: dict[str, Any]) -> None:
        """The connector's totals, from the engine's scheduler stats (kvstore.connector)."""
        try:
            self._kvstore_now = msgspec.convert(data, KVStoreTotals)
        except msgspec.ValidationError:
            log.warning("executor %s: unexpected kvstore stats %r", self.name, data)

    def kvstore_totals(self) -> KVStoreTotals | None:
        if not self._config.kvstore.enabled:
            return None
        return self._kvstore_before.plus(self._kvstore_now)

    def _mark_offload(self, run: Run, request_id: str) -> bool:
        """Just before a preemption's abort: save the job's blocks if its Stop asked for an
        offload. Otherwise nothing is saved: the engine's prefix cache holds the blocks
        until it needs them (KEEP resumes on this executor to find them there)."""
        if (run.stop is StopRequest.PREEMPT and run.offload and self.kvstore_active
                and self._decisions_dir is not None):
            return decisions.mark_offload(self._decisions_dir, request_id)
        return False

    # ---- dispatches ---------------------------------------------------------------------
    # A dispatch is one engine request. Its outputs are not read by a task of its own: the
    # request's _Request stands in for vLLM's per-request output collector, so vLLM's output
    # task hands each step's outputs straight to `_output`, which pushes them to the jobs'
    # streams. That is one wake-up per engine step for the whole batch instead of one task
    # switch per request per step (the HTTP response reading the stream is the only other).

    def _begin(self, run: Run) -> None:
        task = asyncio.create_task(self._submit(run), name=f"{self.name}:{run.job_id}")
        self._adding[run.job_id] = task
        task.add_done_callback(lambda done: self._adding.pop(run.job_id, None)
                               if self._adding.get(run.job_id) is done else None)

    def _halt(self, run: Run) -> None:
        if run.stop is not StopRequest.ABORT:
            return  # a preemption ends at the next token boundary (_output checks run.stop)
        request = self._requests.get(run.job_id)
        if request is not None:  # aborted in the engine at once
            self._finish(request, None, abort=True)
        # else still being added: _submit ends it as soon as the engine has it

    def _drop_runs(self) -> None:
        """Engine down or shutdown: the engine is replaced or stopped right after, so its
        requests are only forgotten, not aborted one by one."""
        for task in self._adding.values():
            task.cancel()
        self._adding.clear()
        for request in self._requests.values():
            request.done = True
        self._requests.clear()

    async def _submit(self, run: Run) -> None:
        """Add the dispatch's request to the engine and take over its outputs."""
        from vllm.inputs import TokensPrompt

        launch = run.launch
        request_id = f"{launch.job_id}.{launch.dispatch}"
        wants_prompt_logprobs = launch.stream.prompt_logprobs is None and \
            launch.sampling.prompt_logprobs is not None
        transfer = decisions.params(request_id) if self.kvstore_active else None
        params = vllm_params.for_launch(launch, wants_prompt_logprobs, transfer)
        request = _Request(self, run, request_id, wants_prompt_logprobs)
        try:
            collector = await self._engine.add_request(
                request_id, TokensPrompt(prompt_token_ids=launch.prompt_token_ids
                                         + launch.generated_token_ids),
                params, priority=launch.engine_priority)
        except asyncio.CancelledError:  # engine down or shutdown meanwhile
            self._end_run(run, None)
            raise
        except Exception as exc:  # noqa: BLE001 - a refused request ends this job only
            self._failed(request, exc)
            return
        self._requests[run.job_id] = request
        # From here on vLLM's output task calls request.put; what it put in its own
        # collector before (nothing, unless the engine was very quick) comes first.
        state = self._engine.output_processor.request_states.get(collector.request_id)
        if state is not None:
            state.queue = request
        try:
            earlier = collector.get_nowait()
        except Exception as exc:  # noqa: BLE001 - the collector holds the engine's error
            earlier = exc
        if earlier is not None:
            request.put(earlier)
        if run.stop is StopRequest.ABORT and not request.done:  # aborted while being added
            self._finish(request, None, abort=True)

    def _output(self, request: _Request, out: Any) -> None:
        """One engine step's output for one request (called by vLLM's output task)."""
        if isinstance(out, BaseException):
            self._failed(request, out)
            return
        run, stream = request.run, request.run.launch.stream
        if not request.started:
            request.started = True
            self._started(run, int(getattr(out, "num_cached_tokens", 0) or 0))
        if request.wants_prompt_logprobs and out.prompt_logprobs:
            stream.prompt_logprobs = (stream.prompt_logprobs or []) + \
                vllm_params.positions(out.prompt_logprobs)
        completion = out.outputs[0]
        logprobs = vllm_params.positions(completion.logprobs) \
            if completion.logprobs is not None else None
        if self._emit(run, completion.text, list(completion.token_ids),
                      logprobs):  # type: ignore[arg-type]  # no None positions
            self._finish(request, "stop", abort=True)  # a stop string (the stream checks)
        elif completion.finish_reason is not None:
            if completion.stop_reason is not None:  # a stop token id
                stream.stop_reason = completion.stop_reason
            self._finish(request, str(completion.finish_reason))
        elif run.stop is not None:  # preempted: ends here, at a token boundary
            offloaded = self._mark_offload(run, request.request_id)
            self._finish(request, None, abort=True, kv_offloaded=offloaded)

    def _failed(self, request: _Request, exc: BaseException) -> None:
        """The engine refused the request (adding it raised) or failed it. An engine
        failure takes the engine out of service (the task reports every run, this one
        too). An error handed to a live request comes from vLLM's output task dying
        (propagate_error): no request gets outputs any more, which is the engine's failure
        too. Otherwise only this job fails."""
        live = self._requests.get(request.job_id) is request
        why = self.engine_failure(exc)
        if why is None and live:
            why = f"vLLM's output task failed ({type(exc).__name__}: {exc})"
        if why is not None:
            self._engine_failed(why, request.run.engine)
            return
        log.error("executor %s: job %s failed: %r", self.name, request.job_id, exc)
        self._finish(request, None, error=f"engine error: {exc}")

    def _finish(self, request: _Request, reason: str | None, *, abort: bool = False,
                error: str | None = None, kv_offloaded: bool = False) -> None:
        """The dispatch ended; `abort`: the engine request is still live, abort it."""
        request.done = True
        if self._requests.get(request.job_id) is request:
            del self._requests[request.job_id]
        if abort and self._engine is not None:
            self._abort(request.request_id)
        self._end_run(request.run, reason, error, kv_offloaded)

    def _abort(self, request_id: str) -> None:
        """Abort an engine request (vLLM's abort is a coroutine; it runs after this step's
        outputs are handled, and outputs that come before it are ignored)."""
        task = asyncio.create_task(self._engine.abort(request_id))
        self._aborting.add(task)
        task.add_done_callback(self._aborted)

    def _aborted(self, task: asyncio.Task[None]) -> None:
        self._aborting.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("executor %s: aborting an engine request failed: %r", self.name, exc)


class _Request:
    """One dispatch's engine request, in the place of vLLM's per-request output collector
    (RequestOutputCollector: vLLM's output task calls `put`)."""

    __slots__ = ("done", "executor", "request_id", "run", "started", "wants_prompt_logprobs")

    def __init__(self, executor: VLLMExecutor, run: Run, request_id: str,
                 wants_prompt_logprobs: bool) -> None:
        self.executor = executor
        self.run = run
        self.request_id = request_id
        self.wants_prompt_logprobs = wants_prompt_logprobs
        self.started = False  # its first output came (Started was reported)
        self.done = False  # its run ended: later outputs (before the abort lands) are ignored

    @property
    def job_id(self) -> str:
        return self.run.job_id

    def put(self, output: Any) -> None:
        if self.done:
            return
        try:
            self.executor._output(self, output)
        except Exception as exc:  # this runs in vLLM's output task: whatever goes wrong
            # with one job ends that job, not the task every request depends on
            log.exception("executor %s: job %s failed", self.executor.name, self.job_id)
            if not self.done:
                self.executor._finish(self, None, abort=True, error=f"internal error: {exc}")
