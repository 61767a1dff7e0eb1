"""VLLMExecutor: one vLLM V1 AsyncLLM engine, the only module that imports vLLM.

Preemption is abort + resume: the engine request is aborted at a token boundary, the job
keeps its generated ids, and the next dispatch submits prompt + generated ids with the
remaining budget. Each dispatch is one private task consuming one engine request's stream. With prefix caching on, the resumed prefill mostly hits cached blocks.
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
import contextlib
import logging
import os
import shutil
import tempfile
from typing import Any

import msgspec

from daemon.config import Config
from daemon.core.events import Capacity, Event
from daemon.core.job import SamplingSpec, StopRequest
from daemon.executors import enginefork, spawn, vllm_params
from daemon.executors.base import EngineStats, Executor, KVStoreTotals, Run
from daemon.executors.settings import cpu_cores
from kvstore import decisions

log = logging.getLogger(__name__)
# The core binding the daemon was started with, for "cpu" devices (None: vLLM's "auto").
_INHERITED_CPU_BIND = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")


class _StatsRecorder:
    """A vLLM per-engine stat logger (duck-typed StatLoggerBase) that keeps the engine's
    last scheduler stats on the executor instead of logging them. Passing it as the only
    custom logger, with vLLM's default loggers off, turns stats on without the periodic
    log lines. It runs on the event loop, in AsyncLLM's output handler."""

    def __init__(self, executor: VLLMExecutor, vllm_config: Any) -> None:
        self._executor = executor
        self._cache = vllm_config.cache_config

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0) -> None:
        if iteration_stats is not None:  # vLLM's own vllm:num_preemptions counts these
            self._executor.engine_preemptions += iteration_stats.num_preempted_reqs
        if scheduler_stats is None:
            return
        if kvstore := getattr(scheduler_stats, "kv_connector_stats", None):
            self._executor.kvstore_reported(kvstore)
        self._executor.reported_stats = EngineStats(
            num_running_reqs=scheduler_stats.num_running_reqs,
            num_waiting_reqs=(scheduler_stats.num_waiting_reqs
                              + scheduler_stats.num_skipped_waiting_reqs),
            kv_cache_usage=float(scheduler_stats.kv_cache_usage),
            block_size=int(self._cache.block_size or 0),
            num_gpu_blocks=int(self._cache.num_gpu_blocks or 0))

    def log_engine_initialized(self) -> None:
        # Called once the engine has sized its KV cache: num_gpu_blocks is known now.
        self.record(_IdleStats(), None)

    def log(self) -> None:
        pass

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        pass


class _IdleStats:
    """Scheduler stats of an engine with no requests (before its first step)."""

    num_running_reqs = 0
    num_waiting_reqs = 0
    num_skipped_waiting_reqs = 0
    kv_cache_usage = 0.0


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
        self._tasks: dict[str, asyncio.Task[None]] = {}  # job id -> its dispatch's task

    @property
    def kvstore_active(self) -> bool:
        """Whether the running engine has lengthwise's KV connector."""
        return self._kvstore and self._engine is not None

    def _kv_transfer_config(self) -> Any:
        from vllm.config import KVTransferConfig

        kvstore = self._config.kvstore
        if self._decisions_dir is None:
            self._decisions_dir = tempfile.mkdtemp(prefix=f"lengthwise-kvstore-{self.name}-")
        return KVTransferConfig(
            kv_connector="LengthwiseConnector", kv_role="kv_both",
            kv_connector_module_path="kvstore.connector",
            # A block the store cannot supply costs a prefill, never a failed request.
            kv_load_failure_policy="recompute",
            kv_connector_extra_config={"capacity_bytes": kvstore.capacity_bytes,
                                       "quantization": kvstore.quantization,
                                       "decisions_dir": self._decisions_dir})

    def _engine_args(self, kvstore: bool = False) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs

        from daemon.executors.vllm_penalties import CarriedPenalties

        model, engine = self._config.model, self._config.engine
        kwargs: dict[str, Any] = {
            "model": model.path,
            "served_model_name": model.name,
            "max_num_seqs": engine.max_num_seqs,
            # vLLM's own queue only reorders what lengthwise admitted; keep its preemption
            # victim choice in line with ours.
            "scheduling_policy": "priority",
            # Stats stay on (see _StatsRecorder); this only turns vLLM's own loggers off.
            "disable_log_stats": True,
            # Penalties of resumed jobs count the tokens generated before the resume.
            "logits_processors": [CarriedPenalties],
        }
        if model.max_model_len:
            kwargs["max_model_len"] = model.max_model_len
        if self.device.startswith("cuda"):
            kwargs["gpu_memory_utilization"] = engine.gpu_memory_utilization
        kwargs.update(engine.engine_args())  # [engine] vllm_args over lengthwise's defaults
        if kvstore:
            kwargs["kv_transfer_config"] = self._kv_transfer_config()
        return AsyncEngineArgs(**kwargs)

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
            spawn.build_with_env, self._engine_env(), lambda: self._build_engine(kvstore),
            self._forks()))
        # shield: a start cancelled half-way leaves the build to finish, so that shutdown()
        # can stop the engine it gives.
        self._engine = await asyncio.shield(self._building)
        await self._warm_up()

    def _engine_env(self) -> dict[str, str | None]:
        """What this engine's process must inherit: KV size and core binding on CPU, the
        one visible GPU on CUDA."""
        if self.device.startswith("cuda:"):
            return {"CUDA_VISIBLE_DEVICES": self.device.split(":", 1)[1]}
        cores = cpu_cores(self.device)
        return {
            # GiB of KV cache (whole GiB: vLLM parses an integer).
            "VLLM_CPU_KVCACHE_SPACE": str(self._config.engine.cpu_kv_cache_gib),
            # "cpu:IDS" binds this engine's OpenMP threads to its cores; plain "cpu" keeps
            # what the daemon was started with (vLLM's "auto" when unset).
            "VLLM_CPU_OMP_THREADS_BIND": (",".join(map(str, cores)) if cores is not None
                                          else _INHERITED_CPU_BIND),
        }

    def _forks(self) -> bool:
        """Whether this engine's processes start from the warm forkserver (enginefork)."""
        return not self.device.startswith("cuda") and \
            self._config.engine.start_method == "forkserver"

    def _build_engine(self, kvstore: bool) -> Any:
        from vllm.v1.engine.async_llm import AsyncLLM

        if self._forks():
            enginefork.use_forkserver()

        return AsyncLLM.from_engine_args(self._engine_args(kvstore),
                                         stat_loggers=[self._stats_recorder])

    def _stats_recorder(self, vllm_config: Any, engine_index: int) -> Any:
        """vLLM's per-engine stat-logger factory signature."""
        return _StatsRecorder(self, vllm_config)

    async def _warm_up(self) -> None:
        """One short generation so the first client does not pay for lazy init."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=2, temperature=0.0)
        async for _ in self._engine.generate(TokensPrompt(prompt_token_ids=[1, 2, 3]), params,
                                             f"warmup-{self.name}"):
            pass

    async def _close_engine(self) -> None:
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

    def _begin(self, run: Run) -> None:
        task = asyncio.create_task(self._generate(run), name=f"{self.name}:{run.job_id}")
        self._tasks[run.job_id] = task
        task.add_done_callback(lambda done: self._tasks.pop(run.job_id, None)
                               if self._tasks.get(run.job_id) is done else None)

    def _halt(self, run: Run) -> None:
        if run.stop is StopRequest.ABORT and (task := self._tasks.get(run.job_id)) is not None:
            task.cancel()  # closing its stream aborts the request in vLLM at once
        # a preemption ends at the next token boundary (_generate checks run.stop)

    def _drop_runs(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()

    async def _generate(self, run: Run) -> None:
        """One dispatch: stream the engine's outputs into the job's stream until the engine
        finishes it, a stop string ends it or a Stop arrives; then report its end."""
        launch = run.launch
        reason: str | None = None
        kv_offloaded = False
        try:
            reason, kv_offloaded = await self._stream(run)
        except asyncio.CancelledError:  # aborted (Stop), engine down or shutdown
            self._end_run(run, None)
            raise
        except Exception as exc:  # an engine error ends this job, never the daemon
            if (why := self.engine_failure(exc)) is not None:
                self._engine_failed(why)  # the task reports every run, this one too
                return
            log.exception("executor %s: job %s failed", self.name, launch.job_id)
            self._end_run(run, None, error=f"engine error: {exc}")
            return
        self._end_run(run, reason, kv_offloaded=kv_offloaded)

    async def _stream(self, run: Run) -> tuple[str | None, bool]:
        """(the engine's finish reason or None when stopped early, KV offloaded)."""
        from vllm.inputs import TokensPrompt

        launch = run.launch
        prompt = TokensPrompt(prompt_token_ids=launch.prompt_token_ids
                              + launch.generated_token_ids)
        request_id = f"{launch.job_id}.{launch.dispatch}"
        transfer = decisions.params(request_id) if self.kvstore_active else None
        job_stream = launch.stream
        wants_prompt_logprobs = job_stream.prompt_logprobs is None and \
            launch.sampling.prompt_logprobs is not None
        params = vllm_params.for_launch(launch, wants_prompt_logprobs, transfer)
        stream = self._engine.generate(prompt, params, request_id,
                                       priority=launch.engine_priority)
        first = True
        async with contextlib.aclosing(stream):
            async for out in stream:
                if first:
                    self._started(run, int(getattr(out, "num_cached_tokens", 0) or 0))
                    first = False
                if wants_prompt_logprobs and out.prompt_logprobs:
                    job_stream.prompt_logprobs = (job_stream.prompt_logprobs or []) + \
                        vllm_params.positions(out.prompt_logprobs)
                completion = out.outputs[0]
                logprobs = vllm_params.positions(completion.logprobs) \
                    if completion.logprobs is not None else None
                if self._emit(run, completion.text, list(completion.token_ids),
                              logprobs):  # type: ignore[arg-type]  # no None positions
                    return "stop", False  # a stop string (the job's stream checks them)
                if completion.finish_reason is not None:
                    if completion.stop_reason is not None:  # a stop token id
                        job_stream.stop_reason = completion.stop_reason
                    return str(completion.finish_reason), False
                if run.stop is not None:
                    # Closing the generator (aclosing) aborts the request inside vLLM.
                    return None, self._mark_offload(run, request_id)
        return None, False
