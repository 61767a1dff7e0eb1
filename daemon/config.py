"""The configuration tree: frozen msgspec Structs decoded from `etc/lengthwise.toml`.

Every field is documented in the shipped TOML file; the comments here give units and the
reason for a default. Unknown keys and wrong types are errors that name the key.
Reload builds a whole new tree and swaps one reference (see daemon/lifecycle.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import msgspec


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the key."""


class _Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pass


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = 8000
    # Largest accepted request body, bytes; bigger bodies get 413 before decoding.
    max_body_bytes: int = 4 * 1024 * 1024
    # Seconds hypercorn waits for open connections after the drain has finished.
    graceful_timeout_s: float = 5.0


class ModelConfig(_Section):
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


class EngineConfig(_Section):
    # Which executor runs jobs: the real vLLM engine or the cost-model simulator.
    kind: Literal["vllm", "sim"] = "vllm"
    # One executor per entry; for vLLM on a GPU host use "cuda:0", "cuda:1", ...
    devices: list[str] = msgspec.field(default_factory=lambda: ["cpu"])
    # vLLM's own batch cap (max_num_seqs); lengthwise admits at most scheduler.max_running.
    max_num_seqs: int = 8
    # CPU engines: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE).
    cpu_kv_cache_gib: float = 1.0
    # GPU engines: fraction of device memory vLLM may use.
    gpu_memory_utilization: float = 0.9
    # Skip CUDA-graph/compile warm-up: ~20 s start-up instead of ~50 s on CPU.
    enforce_eager: bool = True
    # Lets a preempted job resume without recomputing cached prompt blocks.
    enable_prefix_caching: bool = True
    # Seconds allowed for engine start-up and warm-up before start-up fails.
    startup_timeout_s: float = 600.0


class AgingConfig(_Section):
    # A job that has waited this many seconds is promoted ahead of every non-promoted job
    # (FCFS among promoted jobs): this bounds every wait whatever the policy prefers.
    promote_after_s: float = 60.0
    enabled: bool = True


class SchedulerConfig(_Section):
    # Policy name from the registry in policies/ (fcfs, ...).
    policy: str = "fcfs"
    # Jobs admitted to one executor at once; the rest wait in lengthwise, where the policy
    # orders them. Must be <= engine.max_num_seqs.
    max_running: int = 4
    # Waiting jobs beyond this are refused with 429.
    max_waiting: int = 1024
    aging: AgingConfig = msgspec.field(default_factory=AgingConfig)


class LimitsConfig(_Section):
    # Output cap when the request names none; 0 means "the rest of the context".
    default_max_tokens: int = 0
    # Seconds SIGTERM lets running and waiting jobs finish before they are aborted.
    drain_timeout_s: float = 30.0


class SimConfig(_Section):
    """Cost model of the simulated executor (seconds). `lengthwise profile` fits these."""

    prefill_base_s: float = 0.004
    prefill_per_token_s: float = 0.00002
    decode_base_s: float = 0.008
    decode_per_seq_s: float = 0.0005
    decode_per_context_token_s: float = 0.0000002
    # Token ids are drawn below this (SmolLM2's vocabulary size).
    vocab_size: int = 49152


class LogConfig(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"


class Config(_Section):
    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    engine: EngineConfig = msgspec.field(default_factory=EngineConfig)
    scheduler: SchedulerConfig = msgspec.field(default_factory=SchedulerConfig)
    limits: LimitsConfig = msgspec.field(default_factory=LimitsConfig)
    sim: SimConfig = msgspec.field(default_factory=SimConfig)
    log: LogConfig = msgspec.field(default_factory=LogConfig)


# Sections a running daemon cannot change; a reload that changes them keeps the old ones.
RESTART_ONLY = ("server", "model", "engine")


def decode(text: str | bytes, source: str = "<config>") -> Config:
    try:
        config = msgspec.toml.decode(text, type=Config)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ConfigError(f"{source}: {exc}") from None
    validate(config, source)
    return config


def load(path: str | os.PathLike[str]) -> Config:
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    return decode(text, str(path))


def validate(config: Config, source: str) -> None:
    """Cross-field checks that a type alone cannot express."""
    problems = []
    if not 0 < config.server.port < 65536:
        problems.append("server.port must be in 1..65535")
    if config.engine.max_num_seqs < 1:
        problems.append("engine.max_num_seqs must be >= 1")
    if not 1 <= config.scheduler.max_running <= config.engine.max_num_seqs:
        problems.append("scheduler.max_running must be in 1..engine.max_num_seqs")
    if config.scheduler.max_waiting < 0:
        problems.append("scheduler.max_waiting must be >= 0")
    if not config.engine.devices:
        problems.append("engine.devices must name at least one device")
    if config.model.max_model_len < 0:
        problems.append("model.max_model_len must be >= 0")
    if config.limits.default_max_tokens < 0:
        problems.append("limits.default_max_tokens must be >= 0")
    if config.limits.drain_timeout_s < 0:
        problems.append("limits.drain_timeout_s must be >= 0")
    if config.scheduler.aging.promote_after_s <= 0:
        problems.append("scheduler.aging.promote_after_s must be > 0")
    from policies import registry  # late: policies import daemon.core, not the reverse

    if config.scheduler.policy not in registry.names():
        problems.append(
            f"scheduler.policy {config.scheduler.policy!r} is not one of {registry.names()}"
        )
    if problems:
        raise ConfigError(f"{source}: " + "; ".join(problems))


def restart_only_changes(old: Config, new: Config) -> list[str]:
    """Names of restart-only sections that differ between two trees."""
    return [name for name in RESTART_ONLY if getattr(old, name) != getattr(new, name)]
