"""VLLMExecutor: one vLLM V1 AsyncLLM engine, the only module that imports vLLM.

Preemption is abort + resume: the engine request is aborted at a token boundary, the job
keeps its generated ids, and the next dispatch submits prompt + generated ids with the
remaining budget. With prefix caching on, the resumed prefill mostly hits cached blocks.
What makes a resume exact: penalties count the carried tokens (vllm_penalties.py), stop
strings are checked by the job over all its text (core/stopstrings.py), seeded samples are
never preempted (Job.resumes_exactly).

With [kvstore] enabled, the engine loads lengthwise's KV connector (kvstore/): every request
is submitted asking the connector to consult the daemon when it ends, and a job preempted
with KV residency OFFLOAD is marked in the engine's decisions folder just before its abort
(kvstore/decisions.py), so the connector saves its blocks; its resume loads them. An engine
that cannot start or warm up with the connector runs without it (logged once).

The engine runs in its own process (EngineCore). When that process dies, vLLM flags the
client dead and every stream raises EngineDeadError: the executor is then marked down and
its supervisor replaces the engine with a fresh one (see supervisor.py).
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
from daemon.core.job import Job, KVResidency, StopRequest
from daemon.executors import enginefork, spawn
from daemon.executors.base import EngineStats, Executor, KVStoreTotals
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
    def __init__(self, name: str, device: str, config: Config) -> None:
        super().__init__(name, config.scheduler.max_running)
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

    async def shutdown(self) -> None:
        await self.stop_all_tasks()
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

    def _mark_offload(self, job: Job, request_id: str) -> None:
        """Just before a preemption's abort: save the job's blocks if its policy said
        OFFLOAD. KEEP and DROP save nothing: the engine's prefix cache holds the blocks
        until it needs them (KEEP resumes on this executor to find them there)."""
        if (job.stop_request == StopRequest.PREEMPT and job.kv_residency is KVResidency.OFFLOAD
                and self.kvstore_active and self._decisions_dir is not None):
            job.kv_offloaded = decisions.mark_offload(self._decisions_dir, request_id)

    def _observe_resume(self, job: Job, context_tokens: int, out: Any, offloaded: bool) -> None:
        """First output of a dispatch: a resumed one prefilled what was not cached."""
        if job.num_dispatches > 1:
            cached = int(getattr(out, "num_cached_tokens", 0) or 0)
            for stats in ((self.resume_stats, self.offloaded_resume_stats) if offloaded
                          else (self.resume_stats,)):
                stats.resumes += 1
                stats.context_tokens += context_tokens
                stats.recomputed_tokens += max(context_tokens - cached, 0)

    async def _generate(self, job: Job, max_new_tokens: int, engine_priority: int) -> str | None:
        from vllm.inputs import TokensPrompt

        context = job.prompt_token_ids + job.generated_token_ids
        prompt = TokensPrompt(prompt_token_ids=context)
        request_id = f"{job.job_id}.{job.num_dispatches}"
        transfer = decisions.params(request_id) if self.kvstore_active else None
        offloaded, job.kv_offloaded = job.kv_offloaded, False  # this dispatch resumes it
        stream = self._engine.generate(prompt,
                                       self._sampling_params(job, max_new_tokens, transfer),
                                       request_id, priority=engine_priority)
        loop = asyncio.get_running_loop()
        first = True
        async with contextlib.aclosing(stream):
            async for out in stream:
                if first:
                    self._observe_resume(job, len(context), out, offloaded)
                    first = False
                completion = out.outputs[0]
                if job.emit(completion.text, list(completion.token_ids), loop.time()):
                    return "stop"  # a stop string (the job checks them: stopstrings.py)
                if completion.finish_reason is not None:
                    return str(completion.finish_reason)
                if job.stop_request is not None:
                    self._mark_offload(job, request_id)
                    # Closing the generator (aclosing) aborts the request inside vLLM.
                    return None
        return None

    @staticmethod
    def _sampling_params(job: Job, max_new_tokens: int,
                         kv_transfer_params: dict[str, str] | None = None) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        from daemon.executors import vllm_penalties

        spec = job.sampling
        # vLLM penalizes output tokens only: a resumed job's earlier tokens are prompt now,
        # so its penalties move into the logits processor, which counts them too.
        carried = (job.generated_token_ids
                   if spec.presence_penalty or spec.frequency_penalty else [])
        extra: dict[str, Any] = (vllm_penalties.extra_args(
            spec.presence_penalty, spec.frequency_penalty, list(carried)) if carried else {})
        if kv_transfer_params is not None:
            extra["kv_transfer_params"] = kv_transfer_params  # read by kvstore's connector
        return SamplingParams(
            max_tokens=max_new_tokens,
            temperature=spec.temperature,
            top_p=spec.top_p,
            # Stop strings are the job's (across resumes): Job.emit, stopstrings.py.
            seed=spec.seed,
            ignore_eos=spec.ignore_eos,
            # min_tokens counts from this dispatch; only what is still owed applies.
            min_tokens=max(min(spec.min_tokens - job.num_generated_tokens, max_new_tokens), 0),
            presence_penalty=0.0 if carried else spec.presence_penalty,
            frequency_penalty=0.0 if carried else spec.frequency_penalty,
            extra_args=extra or None,
            output_kind=RequestOutputKind.DELTA,
        )
