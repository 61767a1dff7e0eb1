"""VLLMExecutor: one vLLM V1 AsyncLLM engine, the only module that imports vLLM.

Preemption is abort + resume: the engine request is aborted at a token boundary, the job
keeps its generated ids, and the next dispatch submits prompt + generated ids with the
remaining budget. With prefix caching on, the resumed prefill mostly hits cached blocks.
What makes a resume exact: penalties count the carried tokens (vllm_penalties.py), stop
strings are checked by the job over all its text (core/stopstrings.py), seeded samples are
never preempted (Job.resumes_exactly).

The engine runs in its own process (EngineCore). When that process dies, vLLM flags the
client dead and every stream raises EngineDeadError: the executor is then marked down and
its supervisor replaces the engine with a fresh one (see supervisor.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

from daemon.config import Config, cpu_cores
from daemon.core.job import Job
from daemon.executors import spawn
from daemon.executors.base import EngineStats, Executor

log = logging.getLogger(__name__)
# The core binding the daemon was started with, for "cpu" devices (None: vLLM's "auto").
_INHERITED_CPU_BIND = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")


class _StatsRecorder:
    """A vLLM per-engine stat logger (duck-typed StatLoggerBase) that keeps the engine's
    last scheduler stats on the executor instead of logging them. Passing it as the only
    custom logger, with vLLM's default loggers off, turns stats on without the periodic
    log lines. It runs on the event loop, in AsyncLLM's output handler."""

    def __init__(self, executor: Executor, vllm_config: Any) -> None:
        self._executor = executor
        self._cache = vllm_config.cache_config

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0) -> None:
        if scheduler_stats is None:
            return
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

    def _engine_args(self) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs

        from daemon.executors.vllm_penalties import CarriedPenalties

        model, engine = self._config.model, self._config.engine
        kwargs: dict[str, Any] = {
            "model": model.path,
            "served_model_name": model.name,
            "dtype": model.dtype,
            "max_num_seqs": engine.max_num_seqs,
            "enforce_eager": engine.enforce_eager,
            "enable_prefix_caching": engine.enable_prefix_caching,
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
        return AsyncEngineArgs(**kwargs)

    async def start(self) -> None:
        """Build the engine in a worker thread (the loop keeps serving while it loads: health,
        other executors' streams, the watchdog; other executors build theirs at the same
        time), then warm it up. vLLM starts its output task lazily, on the loop."""
        self._building = asyncio.ensure_future(asyncio.to_thread(
            spawn.build_with_env, self._engine_env(), self._build_engine))
        # shield: a start cancelled half-way leaves the build to finish, so that shutdown()
        # can stop the engine it gives.
        self._engine = await asyncio.shield(self._building)
        await self._warm_up()
        log.info("executor %s ready on %s", self.name, self.device)

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

    def _build_engine(self) -> Any:
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(self._engine_args(),
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
        self._stop_engine()
        await self.start()

    async def _generate(self, job: Job, max_new_tokens: int, engine_priority: int) -> str | None:
        from vllm.inputs import TokensPrompt

        prompt = TokensPrompt(prompt_token_ids=job.prompt_token_ids + job.generated_token_ids)
        request_id = f"{job.job_id}.{job.num_dispatches}"
        stream = self._engine.generate(prompt, self._sampling_params(job, max_new_tokens),
                                       request_id, priority=engine_priority)
        loop = asyncio.get_running_loop()
        async with contextlib.aclosing(stream):
            async for out in stream:
                completion = out.outputs[0]
                if job.emit(completion.text, list(completion.token_ids), loop.time()):
                    return "stop"  # a stop string (the job checks them: stopstrings.py)
                if completion.finish_reason is not None:
                    return str(completion.finish_reason)
                if job.stop_request is not None:
                    # Closing the generator (aclosing) aborts the request inside vLLM.
                    return None
        return None

    @staticmethod
    def _sampling_params(job: Job, max_new_tokens: int) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        from daemon.executors import vllm_penalties

        spec = job.sampling
        # vLLM penalizes output tokens only: a resumed job's earlier tokens are prompt now,
        # so its penalties move into the logits processor, which counts them too.
        carried = (job.generated_token_ids
                   if spec.presence_penalty or spec.frequency_penalty else [])
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
            extra_args=(vllm_penalties.extra_args(spec.presence_penalty, spec.frequency_penalty,
                                                  list(carried)) if carried else None),
            output_kind=RequestOutputKind.DELTA,
        )
