"""The configuration tree: frozen msgspec Structs decoded from `etc/lengthwise.toml`.

Every field is documented in the shipped TOML file; the comments here give units and the
reason for a default. Unknown keys and wrong types are errors that name the key.
Reload builds a whole new tree and swaps one reference (see daemon/lifecycle.py).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import msgspec

from daemon import apikeys
from daemon.core.costmodel import CostModel
from policies import registry  # policies import only daemon.core: no circle

_COST = CostModel()  # [sim]'s defaults are the generic cost model's


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the key."""


class _Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pass


class ServerConfig(_Section, frozen=True):
    host: str = "127.0.0.1"
    port: int = 8000
    # Largest accepted request body, bytes; bigger bodies get 413 before decoding.
    max_body_bytes: int = 4 * 1024 * 1024
    # Seconds hypercorn waits for open connections after the drain has finished.
    graceful_timeout_s: float = 5.0
    # File of API keys (format in daemon/apikeys.py), re-read on SIGHUP; "" = no keys:
    # every client is served (bind to a trusted network only).
    api_keys_file: str = ""
    # With api_keys_file set: /metrics and /health need a key of scope monitoring (or all);
    # false leaves them open for probes and scrapers.
    protect_monitoring: bool = False
    # Listen backlog: connections the kernel queues before the daemon accepts them; a burst
    # beyond it gets connection errors (hypercorn's default is 100). The kernel caps it at
    # net.core.somaxconn.
    backlog: int = 4096
    # Connections with a request in flight (streams too); more get 503 + Retry-After and
    # are closed (/health, /metrics exempt). Keep it below the open-file limit (ulimit -n).
    max_connections: int = 2048


class ModelConfig(_Section, frozen=True):
    # Folder with a HF-format model (config.json, weights, tokenizer). Relative paths are
    # resolved against the working directory.
    path: str = "models/smollm2-135m-instruct"
    # The name clients send as `model`; empty means the folder's base name.
    served_name: str = ""
    # Context length in tokens (prompt + output); 0 means the model's own limit.
    max_model_len: int = 2048
    # Weight/activation dtype passed to vLLM ("auto", "bfloat16", "float32", ...).
    dtype: str = "auto"

    @property
    def name(self) -> str:
        return self.served_name or Path(self.path).name


class EngineConfig(_Section, frozen=True):
    # Which executor runs jobs: the real vLLM engine or the cost-model simulator.
    kind: Literal["vllm", "sim"] = "vllm"
    # One executor (one vLLM engine) per entry: "cuda:N" on a GPU host; "cpu" lets vLLM
    # bind its threads itself; "cpu:IDS" (e.g. "cpu:0-3", "cpu:4,6") binds that engine's
    # threads to those cores, so that several CPU engines do not share cores.
    devices: list[str] = msgspec.field(default_factory=lambda: ["cpu"])
    # vLLM's own batch cap (max_num_seqs); lengthwise admits at most scheduler.max_running.
    max_num_seqs: int = 8
    # CPU engines: KV cache size in whole GiB (VLLM_CPU_KVCACHE_SPACE takes an integer).
    cpu_kv_cache_gib: int = 1
    # GPU engines: fraction of device memory vLLM may use.
    gpu_memory_utilization: float = 0.9
    # KV blocks per engine instead of what vLLM sizes from memory; 0 = vLLM's sizing. For
    # benchmarks that need memory pressure (a CPU engine's cache is at least 1 GiB).
    num_gpu_blocks_override: int = 0
    # Skip CUDA-graph/compile warm-up: ~20 s start-up instead of ~50 s on CPU.
    enforce_eager: bool = True
    # Lets a preempted job resume without recomputing cached prompt blocks.
    enable_prefix_caching: bool = True
    # Seconds allowed for engine start-up and warm-up before start-up fails.
    startup_timeout_s: float = 600.0
    # Seconds between checks that each engine is alive and making progress.
    health_check_interval_s: float = 1.0
    # An engine with admitted jobs and no new token for this many seconds is declared dead
    # (hung); 0 = never. Must exceed the longest prefill a request can need.
    stall_timeout_s: float = 60.0
    # How CPU engines' processes start: "forkserver" forks them from one process that has
    # imported torch and vLLM (an engine restart in seconds: docs/operations.md);
    # "spawn" is vLLM's own way on CPU (two fresh interpreters per engine). GPU engines
    # always start vLLM's way.
    start_method: Literal["forkserver", "spawn"] = "forkserver"
    # Restarts tried after an engine dies before the daemon gives up and exits (status 1,
    # so systemd restarts the whole service).
    restart_attempts: int = 3
    # Seconds before the second restart attempt; doubles for each one after.
    restart_backoff_s: float = 2.0


class AgingConfig(_Section, frozen=True):
    """[scheduler.aging]: every wait is bounded on the workload's own time scale.

    A job's bound is slowdown x the typical predicted service time (an EWMA over arriving
    jobs of the seconds each needs once it runs in a full batch, from the cost model), at
    least min_wait_s and at most promote_after_s. A job whose total wait (all its waits:
    first, and after each preemption or slice) reaches its bound is promoted ahead of every
    non-promoted job, earliest deadline first, and is no longer preempted.
    """

    # The tail knob: a job may wait this many typical service times (0 = only the absolute
    # bound below). Lower: tail nearer FCFS's; higher: mean nearer the policy's own.
    slowdown: float = 4.0
    # Seconds every job may wait before its bound applies (a floor).
    min_wait_s: float = 0.0
    # Absolute backstop (s): no job waits longer than this in total, whatever its size.
    promote_after_s: float = 60.0
    # A promoted job that finds no free slot preempts the running job with the most
    # predicted work left (if that is more than its own), for every policy.
    preempt: bool = True
    # Before launching the policy's pick, check that no waiting job would then miss its
    # bound that it meets if jobs start in deadline order (the first 64 deadlines); if one
    # would, the earliest deadline goes first. Acts before a bound is missed, not after.
    lookahead: bool = True
    enabled: bool = True


class SchedulerConfig(_Section, frozen=True):
    # Policy name from the registry in policies/: fcfs, ssjf, hrrn, isrtf, alise, scls,
    # oracle-sjf, oracle-srpt (oracles need true lengths: benchmarks only).
    policy: str = "fcfs"
    # Jobs admitted to one executor at once; the rest wait in lengthwise, where the policy
    # orders them. Must be <= engine.max_num_seqs.
    max_running: int = 4
    # Waiting jobs beyond this are refused with 429.
    max_waiting: int = 1024
    # Learn the factor between predicted and actual lengths from jobs that stopped by
    # themselves, and scale predictions by it (core/calibration.py).
    calibrate_lengths: bool = True
    # A request's max_tokens caps its predicted length. Turn off only in benchmarks that
    # force every output length through max_tokens: there the cap hands policies the truth.
    trust_budget: bool = True
    # Executor for a job: by predicted outstanding work, or as routers do (benchmarks).
    placement: Literal["predicted", "least_queue", "round_robin"] = "predicted"
    aging: AgingConfig = msgspec.field(default_factory=AgingConfig)


def _policies_section() -> type[msgspec.Struct]:
    """[policies.*]: each policy's own parameter Struct, collected through the registry
    (policies/*.py define and document them); only the active policy's section is read."""
    fields = [(name, kind, msgspec.field(default_factory=kind))
              for name, kind in registry.sections().items()]
    return msgspec.defstruct("PoliciesConfig", fields, bases=(_Section,), frozen=True,
                             forbid_unknown_fields=True, kw_only=True)


if TYPE_CHECKING:  # a runtime-built type: mypy sees only the base, fields by getattr
    PoliciesConfig = _Section
else:
    PoliciesConfig = _policies_section()


class LimitsConfig(_Section, frozen=True):
    # Output cap when the request names none; 0 means "the rest of the context".
    default_max_tokens: int = 0
    # Seconds SIGTERM lets running and waiting jobs finish before they are aborted.
    drain_timeout_s: float = 30.0
    # Range of the request field `priority` (lower = more urgent, a class ahead of every
    # job of a higher value); anything outside gets a 400.
    priority_min: int = -100
    priority_max: int = 100


class SimConfig(_Section, frozen=True):
    """Cost model of the simulated executor (seconds). `lengthwise profile` fits these."""

    prefill_base_s: float = _COST.prefill_base_s
    prefill_per_token_s: float = _COST.prefill_per_token_s
    decode_base_s: float = _COST.decode_base_s
    decode_per_seq_s: float = _COST.decode_per_seq_s
    decode_per_context_token_s: float = _COST.decode_per_context_token_s
    # Token ids are drawn below this (SmolLM2's vocabulary size).
    vocab_size: int = 49152
    # Size of the simulated engine's KV cache, tokens (16-token blocks); only for the KV
    # usage it reports in /metrics (vllm:kv_cache_usage_perc).
    kv_capacity_tokens: int = 131072


class PredictorConfig(_Section, frozen=True):
    # Folder of a trained predictor (`lengthwise predictor train --out DIR`); "" = the small
    # proxy shipped with lengthwise; "none" = no prediction (every job gets the fallback).
    path: str = ""
    # Folder of a trained iterative predictor (`train --kind iterative`) that re-predicts a
    # running job's remaining tokens from prompt + partial answer at policy checkpoints
    # (isrtf, alise); "" = the one shipped with lengthwise; "none" = off (remaining = first
    # prediction minus tokens generated).
    iterative_path: str = ""
    # Seconds a request waits for its prediction before it gets the fallback estimate.
    timeout_s: float = 0.5
    # Most requests predicted in one model call.
    max_batch: int = 32
    # Estimate (output tokens) used before any completion was observed, when prediction
    # is off, fails or is late; afterwards the mean of observed lengths is used.
    fallback_tokens: float = 256.0
    # Torch threads for the predictor; the engines need the other cores.
    threads: int = 1
    # Seconds between saves of online state (the retrieval index).
    save_interval_s: float = 60.0
    # JSONL file of natural completions in the predictor's record shape; "" = off.
    request_log: str = ""


class CostModelConfig(_Section, frozen=True):
    # A `lengthwise profile` JSON file (relative to the working dir) whose fitted
    # coefficients drive the policies' time estimates and the core's wait bounds;
    # "" = the [sim] section's. Read at start and on reload.
    profile: str = ""


class KVStoreConfig(_Section, frozen=True):
    """[kvstore]: the CPU store behind vLLM's KV-connector API (kvstore/, docs/kvstore.md).

    A preempted job whose policy advises OFFLOAD has its KV blocks saved there when the
    engine aborts it, and loaded back (instead of prefilled again) when it resumes on the
    same executor. Each engine has its own store, inside its engine process."""

    # Load lengthwise's KV connector into every vLLM engine. An engine that cannot start
    # with it starts without it (preempted jobs then recompute: drop), logged once.
    enabled: bool = False
    # Bytes of encoded KV blocks each engine's store may hold; least recently used blocks
    # are evicted beyond it.
    capacity_bytes: int = 1 << 30
    # How blocks are stored: "int8" (per-channel scales, ~0.52x of bf16) or "none" (the
    # engine's own dtype: a resume is exactly the uninterrupted run).
    quantization: Literal["int8", "none"] = "int8"
    # Engine failures (deaths, hangs) with the connector loaded after which an executor
    # restarts its engine without it (preempted jobs then recompute), so a connector that
    # crashes the engine cannot keep it restarting; 0 = never give up on it. Failures of
    # any cause count: the engine does not say why it died.
    max_engine_failures: int = 3


class LogConfig(_Section, frozen=True):
    level: Literal["debug", "info", "warning", "error"] = "info"


class Config(_Section, frozen=True):
    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    engine: EngineConfig = msgspec.field(default_factory=EngineConfig)
    scheduler: SchedulerConfig = msgspec.field(default_factory=SchedulerConfig)
    policies: PoliciesConfig = msgspec.field(default_factory=PoliciesConfig)
    limits: LimitsConfig = msgspec.field(default_factory=LimitsConfig)
    sim: SimConfig = msgspec.field(default_factory=SimConfig)
    costmodel: CostModelConfig = msgspec.field(default_factory=CostModelConfig)
    predictor: PredictorConfig = msgspec.field(default_factory=PredictorConfig)
    kvstore: KVStoreConfig = msgspec.field(default_factory=KVStoreConfig)
    log: LogConfig = msgspec.field(default_factory=LogConfig)


_CORES = r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*"  # Linux CPU-list syntax: "0-3,8"
_DEVICE = re.compile(rf"^(?:cpu(?::{_CORES})?|cuda:\d+)$")


def cpu_cores(device: str) -> list[int] | None:
    """The cores a "cpu:IDS" device names, in order; None for "cpu" and GPU devices."""
    if not device.startswith("cpu:"):
        return None
    cores: list[int] = []
    for part in device.removeprefix("cpu:").split(","):
        first, _, last = part.partition("-")
        cores += range(int(first), int(last or first) + 1)
    return cores


SIM_KV_BLOCK_TOKENS = 16  # the simulated engine's KV block size, tokens

# Sections a running daemon cannot change; a reload that changes them keeps the old ones.
RESTART_ONLY = ("server", "model", "engine", "predictor", "kvstore")


def decode(text: str | bytes, source: str = "<config>") -> Config:
    try:
        config = msgspec.toml.decode(text, type=Config)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{source}: malformed TOML: {exc}") from None
    validate(config, source)
    return config


def load(path: str | os.PathLike[str]) -> Config:
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    config = decode(text, str(path))
    if config.server.api_keys_file:
        try:
            apikeys.load(config.server.api_keys_file)
        except apikeys.KeyFileError as exc:
            raise ConfigError(f"{path}: server.api_keys_file: {exc}") from None
    return config


def validate(config: Config, source: str) -> None:
    """Cross-field checks that a type alone cannot express."""
    problems = []
    if not 0 < config.server.port < 65536:
        problems.append("server.port must be in 1..65535")
    if config.server.backlog < 1 or config.server.max_connections < 1:
        problems.append("server.backlog and server.max_connections must be >= 1")
    pred = config.predictor
    if pred.timeout_s <= 0 or pred.max_batch < 1 or pred.threads < 1:
        problems.append("predictor.timeout_s must be > 0, max_batch and threads >= 1")
    if config.engine.cpu_kv_cache_gib < 1:
        problems.append("engine.cpu_kv_cache_gib must be >= 1")
    if config.sim.kv_capacity_tokens < SIM_KV_BLOCK_TOKENS:
        problems.append(f"sim.kv_capacity_tokens must be >= {SIM_KV_BLOCK_TOKENS}")
    if config.kvstore.capacity_bytes < 0 or config.kvstore.max_engine_failures < 0:
        problems.append("kvstore.capacity_bytes and max_engine_failures must be >= 0")
    if config.engine.num_gpu_blocks_override < 0:
        problems.append("engine.num_gpu_blocks_override must be >= 0")
    if config.engine.max_num_seqs < 1:
        problems.append("engine.max_num_seqs must be >= 1")
    if not 1 <= config.scheduler.max_running <= config.engine.max_num_seqs:
        problems.append("scheduler.max_running must be in 1..engine.max_num_seqs")
    if config.scheduler.max_waiting < 0:
        problems.append("scheduler.max_waiting must be >= 0")
    engine = config.engine
    if engine.health_check_interval_s <= 0 or engine.stall_timeout_s < 0:
        problems.append("engine.health_check_interval_s must be > 0, stall_timeout_s >= 0")
    if engine.restart_attempts < 0 or engine.restart_backoff_s < 0:
        problems.append("engine.restart_attempts and restart_backoff_s must be >= 0")
    if not config.engine.devices:
        problems.append("engine.devices must name at least one device")
    problems += [f"engine.devices: {dev!r} is not 'cpu', 'cpu:IDS' (e.g. 'cpu:0-3,8') or "
                 "'cuda:N'" for dev in config.engine.devices if not _DEVICE.match(dev)]
    if config.model.max_model_len < 0:
        problems.append("model.max_model_len must be >= 0")
    if config.limits.default_max_tokens < 0:
        problems.append("limits.default_max_tokens must be >= 0")
    if config.limits.drain_timeout_s < 0:
        problems.append("limits.drain_timeout_s must be >= 0")
    if config.limits.priority_min > config.limits.priority_max:
        problems.append("limits.priority_min must be <= limits.priority_max")
    aging = config.scheduler.aging
    if aging.promote_after_s <= 0:
        problems.append("scheduler.aging.promote_after_s must be > 0")
    if aging.slowdown < 0:
        problems.append("scheduler.aging.slowdown must be >= 0")
    if not 0 <= aging.min_wait_s <= aging.promote_after_s:
        problems.append("scheduler.aging.min_wait_s must be in [0, promote_after_s]")
    problems += _policy_problems(config.policies)
    try:
        cost_model(config)
    except ConfigError as exc:
        problems.append(str(exc))
    if config.scheduler.policy not in registry.names():
        problems.append(
            f"scheduler.policy {config.scheduler.policy!r} is not one of {registry.names()}"
        )
    if problems:
        raise ConfigError(f"{source}: " + "; ".join(problems))


def _policy_problems(sections: msgspec.Struct) -> list[str]:
    problems = []
    for name in registry.sections():
        params = getattr(sections, name)
        problems += [f"policies.{name}.{problem}" for problem in params.problems()]
    return problems


def restart_only_changes(old: Config, new: Config) -> list[str]:
    """Names of restart-only sections that differ between two trees."""
    return [name for name in RESTART_ONLY if getattr(old, name) != getattr(new, name)]


class _ProfileFile(msgspec.Struct):
    """The part of a profile file (bench/costfile.Profile) the daemon reads."""

    sim: SimConfig


def cost_model(config: Config) -> CostModel:
    """The engine cost model the policies and the core's aging use: `[costmodel] profile`
    (a file `lengthwise profile` writes) or the `[sim]` section. Read at start and on every
    reload; a missing or malformed file is a ConfigError."""
    path = config.costmodel.profile
    if not path:
        return CostModel.from_sim(config.sim)
    try:
        profile = msgspec.json.decode(Path(path).read_bytes(), type=_ProfileFile)
    except OSError as exc:
        raise ConfigError(f"costmodel.profile: cannot read {path}: {exc.strerror}") from None
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ConfigError(f"costmodel.profile: {path} is not a cost profile: {exc}") from None
    return CostModel.from_sim(profile.sim)
