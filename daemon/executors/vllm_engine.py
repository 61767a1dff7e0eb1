"""How the vLLM executor's engine is built (part of the vLLM executor: only vllm.py uses it):
its AsyncEngineArgs, the environment its processes inherit, its KV connector's settings, and
the stat logger that keeps its scheduler stats on the executor."""

from __future__ import annotations

import logging
import os
from typing import Any, Protocol

from daemon.config import Config, KVStoreConfig
from daemon.executors.base import EngineStats
from daemon.executors.settings import cpu_cores

log = logging.getLogger(__name__)

# The core binding the daemon was started with, for "cpu" devices (None: vLLM's "auto").
_INHERITED_CPU_BIND = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")


def engine_args(config: Config, device: str, kv_transfer_config: Any = None) -> Any:
    """vLLM's AsyncEngineArgs: lengthwise's defaults, then the operator's [engine] vllm_args,
    then the KV connector (kvstore) if given."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    from daemon.executors.vllm_penalties import CarriedPenalties

    model, engine = config.model, config.engine
    kwargs: dict[str, Any] = {
        "model": model.path,
        "served_model_name": model.name,
        "max_num_seqs": engine.max_num_seqs,
        # vLLM's own queue only reorders what lengthwise admitted; keep its preemption
        # victim choice in line with ours.
        "scheduling_policy": "priority",
        # Stats stay on (see StatsRecorder); this only turns vLLM's own loggers off.
        "disable_log_stats": True,
        # Penalties of resumed jobs count the tokens generated before the resume.
        "logits_processors": [CarriedPenalties],
    }
    if model.max_model_len:
        kwargs["max_model_len"] = model.max_model_len
    if device.startswith("cuda"):
        kwargs["gpu_memory_utilization"] = engine.gpu_memory_utilization
    kwargs.update(engine.engine_args())  # [engine] vllm_args over lengthwise's defaults
    if kv_transfer_config is not None:
        kwargs["kv_transfer_config"] = kv_transfer_config
    return AsyncEngineArgs(**kwargs)


def kv_transfer_config(kvstore: KVStoreConfig, decisions_dir: str) -> Any:
    """lengthwise's KV connector (kvstore/) for one engine, consulting `decisions_dir`."""
    from vllm.config import KVTransferConfig

    return KVTransferConfig(
        kv_connector="LengthwiseConnector", kv_role="kv_both",
        kv_connector_module_path="kvstore.connector",
        # A block the store cannot supply costs a prefill, never a failed request.
        kv_load_failure_policy="recompute",
        kv_connector_extra_config={"capacity_bytes": kvstore.capacity_bytes,
                                   "quantization": kvstore.quantization,
                                   "decisions_dir": decisions_dir})


def engine_env(config: Config, device: str) -> dict[str, str | None]:
    """What an engine's process must inherit: KV size and core binding on CPU, the one
    visible GPU on CUDA."""
    if device.startswith("cuda:"):
        return {"CUDA_VISIBLE_DEVICES": device.split(":", 1)[1]}
    cores = cpu_cores(device)
    return {
        # GiB of KV cache (whole GiB: vLLM parses an integer).
        "VLLM_CPU_KVCACHE_SPACE": str(config.engine.cpu_kv_cache_gib),
        # "cpu:IDS" binds this engine's OpenMP threads to its cores; plain "cpu" keeps
        # what the daemon was started with (vLLM's "auto" when unset).
        "VLLM_CPU_OMP_THREADS_BIND": (",".join(map(str, cores)) if cores is not None
                                      else _INHERITED_CPU_BIND),
    }


class StatsSink(Protocol):
    """Where StatsRecorder keeps what the engine reports (the vLLM executor)."""

    engine_preemptions: int
    reported_stats: EngineStats | None

    def kvstore_reported(self, data: dict[str, Any]) -> None: ...


class StatsRecorder:
    """A vLLM per-engine stat logger (duck-typed StatLoggerBase) that keeps the engine's
    last scheduler stats on the executor instead of logging them. Passing it as the only
    custom logger, with vLLM's default loggers off, turns stats on without the periodic
    log lines. It runs on the event loop, in AsyncLLM's output handler.

    With `enable_logging_iteration_details = true` in [engine] vllm_args, the engine reports
    every step's batch and time, and this logs them as vLLM's own server does (one INFO line
    a step, "Iteration(N): ..."), which vLLM's logger, turned off here, would otherwise drop.
    """

    def __init__(self, sink: StatsSink, vllm_config: Any, name: str = "") -> None:
        self._sink = sink
        self._cache = vllm_config.cache_config
        self._prefix = f"executor {name}: " if name else ""

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0) -> None:
        if iteration_stats is not None:  # vLLM's own vllm:num_preemptions counts these
            self._sink.engine_preemptions += iteration_stats.num_preempted_reqs
        if scheduler_stats is None:
            return
        if (step := getattr(scheduler_stats, "iteration_details", None)) is not None:
            log.info("%sIteration(%d): %d context requests, %d context tokens, %d generation "
                     "requests, %d generation tokens, iteration elapsed time: %.2f ms, KV "
                     "cache usage: %.1f%%", self._prefix, step.iteration_index,
                     step.num_ctx_requests, step.num_ctx_tokens, step.num_generation_requests,
                     step.num_generation_tokens, step.elapsed_ms,
                     100 * scheduler_stats.kv_cache_usage)
        if kvstore := getattr(scheduler_stats, "kv_connector_stats", None):
            self._sink.kvstore_reported(kvstore)
        self._sink.reported_stats = EngineStats(
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
