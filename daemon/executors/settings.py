"""The executors' settings: `[engine]`, `[kvstore]`, and the simulated engine's cost model.

daemon.config collects `EngineConfig` and `KVStoreConfig` into the operator's tree.
`SimConfig` is not part of it: it is what the simulated executor runs, read from a
`lengthwise profile` file (its `sim` section, `[costmodel] profile`) or these defaults, and
what the simulator's `--profile` sets.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from daemon.core.costmodel import CostModel
from daemon.core.settings import BENCH_KNOB

_COST = CostModel()  # the generic cost model's coefficients are the simulated engine's
_NonNegative = msgspec.Meta(ge=0)
_Positive = msgspec.Meta(gt=0)

_CORES = r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*"  # Linux CPU-list syntax: "0-3,8"
# "cpu", "cpu:IDS" (e.g. "cpu:0-3,8") or "cuda:N"
Device = Annotated[str, msgspec.Meta(pattern=rf"^(?:cpu(?::{_CORES})?|cuda:\d+)$")]

# Engine arguments lengthwise sets itself (from [model], [engine], [kvstore] and its own
# needs: priority scheduling, the carried penalties, its stats); vllm_args may not.
OWN_VLLM_ARGS = frozenset({
    "model", "served_model_name", "max_num_seqs", "max_model_len", "gpu_memory_utilization",
    "scheduling_policy", "disable_log_stats", "logits_processors", "kv_transfer_config"})
# lengthwise's own defaults for arguments vllm_args may change: skip graph capture (CPU
# start-up ~20 s instead of ~50 s) and keep prefix caching on (a preempted job resumes
# without recomputing its cached prompt blocks).
DEFAULT_VLLM_ARGS: dict[str, Any] = {"enforce_eager": True, "enable_prefix_caching": True}


class EngineConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    # Which executor runs jobs: the real vLLM engine or the cost-model simulator.
    kind: Literal["vllm", "sim"] = "vllm"
    # One executor (one vLLM engine) per entry: "cuda:N" on a GPU host; "cpu" lets vLLM
    # bind its threads itself; "cpu:IDS" (e.g. "cpu:0-3", "cpu:4,6") binds that engine's
    # threads to those cores, so that several CPU engines do not share cores.
    devices: Annotated[list[Device], msgspec.Meta(min_length=1)] = msgspec.field(
        default_factory=lambda: ["cpu"])
    # vLLM's own batch cap (max_num_seqs); lengthwise admits at most scheduler.max_running.
    max_num_seqs: Annotated[int, msgspec.Meta(ge=1)] = 8
    # CPU engines: KV cache size in whole GiB (VLLM_CPU_KVCACHE_SPACE takes an integer).
    cpu_kv_cache_gib: Annotated[int, msgspec.Meta(ge=1)] = 1
    # GPU engines: fraction of device memory vLLM may use.
    gpu_memory_utilization: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.9
    # More vLLM engine arguments (AsyncEngineArgs fields: dtype, num_gpu_blocks_override,
    # enforce_eager, enable_prefix_caching, ...), over DEFAULT_VLLM_ARGS. Names are checked
    # against the installed vLLM before engines start (daemon/preflight.py); OWN_VLLM_ARGS
    # are refused.
    vllm_args: dict[str, Any] = msgspec.field(default_factory=dict)
    # Seconds allowed for engine start-up and warm-up before start-up fails.
    startup_timeout_s: Annotated[float, _Positive] = 600.0
    # Seconds between checks that each engine is alive and making progress.
    health_check_interval_s: Annotated[float, _Positive] = 1.0
    # An engine with admitted jobs and no new token for this many seconds is declared dead
    # (hung); 0 = never. Must exceed the longest prefill a request can need.
    stall_timeout_s: Annotated[float, _NonNegative] = 60.0
    # Restarts tried after an engine dies before the daemon gives up and exits (status 1,
    # so systemd restarts the whole service).
    restart_attempts: Annotated[int, _NonNegative] = 3
    # Seconds before the second restart attempt; doubles for each one after.
    restart_backoff_s: Annotated[float, _NonNegative] = 2.0
    # How CPU engines' processes start: "forkserver" forks them from one process that has
    # imported torch and vLLM (an engine restart in seconds: docs/operations.md);
    # "spawn" is vLLM's own way on CPU (two fresh interpreters per engine), kept for the
    # comparison there. GPU engines always start vLLM's way.
    start_method: Annotated[Literal["forkserver", "spawn"], BENCH_KNOB] = "forkserver"

    def engine_args(self) -> dict[str, Any]:
        """vllm_args over lengthwise's defaults."""
        return {**DEFAULT_VLLM_ARGS, **self.vllm_args}


class KVStoreConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """[kvstore]: the CPU store behind vLLM's KV-connector API (kvstore/, docs/kvstore.md).

    A preempted job whose policy advises OFFLOAD has its KV blocks saved there when the
    engine aborts it, and loaded back (instead of prefilled again) when it resumes on the
    same executor. Each engine has its own store, inside its engine process."""

    # Load lengthwise's KV connector into every vLLM engine. An engine that cannot start
    # with it starts without it (preempted jobs then recompute: drop), logged once.
    enabled: bool = False
    # Bytes of encoded KV blocks each engine's store may hold; least recently used blocks
    # are evicted beyond it.
    capacity_bytes: Annotated[int, _NonNegative] = 1 << 30
    # How blocks are stored: "int8" (per-channel scales, ~0.52x of bf16) or "none" (the
    # engine's own dtype: a resume is exactly the uninterrupted run).
    quantization: Literal["int8", "none"] = "int8"
    # Engine failures (deaths, hangs) with the connector loaded after which an executor
    # restarts its engine without it (preempted jobs then recompute), so a connector that
    # crashes the engine cannot keep it restarting; 0 = never give up on it. Failures of
    # any cause count: the engine does not say why it died.
    max_engine_failures: Annotated[int, _NonNegative] = 3


SIM_KV_BLOCK_TOKENS = 16  # the simulated engine's KV block size, tokens


class SimConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The simulated executor's engine (seconds): the cost-model coefficients `lengthwise
    profile` fits (a profile file's `sim` section), its vocabulary and its KV cache."""

    prefill_base_s: Annotated[float, _NonNegative] = _COST.prefill_base_s
    prefill_per_token_s: Annotated[float, _NonNegative] = _COST.prefill_per_token_s
    decode_base_s: Annotated[float, _NonNegative] = _COST.decode_base_s
    decode_per_seq_s: Annotated[float, _NonNegative] = _COST.decode_per_seq_s
    decode_per_context_token_s: Annotated[float, _NonNegative] = _COST.decode_per_context_token_s
    # Token ids are drawn below this (SmolLM2's vocabulary size).
    vocab_size: Annotated[int, msgspec.Meta(ge=1)] = 49152
    # The simulated engine's KV cache, tokens, and its block size: it runs what fits and
    # preempts (recompute) when its batch outgrows it, as vLLM does (executors/sim.py).
    kv_capacity_tokens: Annotated[int, msgspec.Meta(ge=SIM_KV_BLOCK_TOKENS)] = 131072
    kv_block_tokens: Annotated[int, msgspec.Meta(ge=1)] = SIM_KV_BLOCK_TOKENS


def cpu_cores(device: str) -> list[int] | None:
    """The cores a "cpu:IDS" device names, in order; None for "cpu" and GPU devices."""
    if not device.startswith("cpu:"):
        return None
    cores: list[int] = []
    for part in device.removeprefix("cpu:").split(","):
        first, _, last = part.partition("-")
        cores += range(int(first), int(last or first) + 1)
    return cores
