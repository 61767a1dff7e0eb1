"""The operator's configuration: `etc/lengthwise.toml` decoded into a tree of frozen Structs.

Each room owns the settings it reads: the core's `[scheduler]` (daemon/core/settings.py),
the executors' `[engine]` and `[kvstore]` (daemon/executors/settings.py), each policy's
`[policies.NAME]` (its module, collected through policies.registry). The sections read by
the daemon's own wiring are defined here. This module collects them, loads and validates.

Constraints are declared on the fields (`msgspec.Meta`); what remains below are the checks
that span sections or rooms. A bad value, an unknown key or a wrong type is an error that
names its key. Fields marked `BENCH_KNOB` are for benchmarks and tests: an operator's file
that names one is refused like an unknown key, unless the daemon runs with
LENGTHWISE_BENCH_KNOBS=1 (bench commands set it for the daemons they start).
Reload builds a whole new tree and swaps one reference (see daemon/lifecycle.py).
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec

from daemon import apikeys
from daemon.core.costmodel import CostModel
from daemon.core.settings import BENCH_KNOB, AgingConfig, SchedulerConfig
from daemon.executors.settings import (
    OWN_VLLM_ARGS,
    SIM_KV_BLOCK_TOKENS,
    EngineConfig,
    KVStoreConfig,
    SimConfig,
    cpu_cores,
)
from policies import registry  # policies import only daemon.core: no circle

__all__ = ["BENCH_KNOBS_ENV", "RESTART_ONLY", "SIM_KV_BLOCK_TOKENS", "AgingConfig", "Config",
           "ConfigError", "EngineConfig", "KVStoreConfig", "SchedulerConfig", "SimConfig",
           "bench_knob_keys", "cost_model", "cost_profile", "cpu_cores", "decode", "key_error",
           "load", "restart_only_changes", "slots_per_engine", "validate"]

BENCH_KNOBS_ENV = "LENGTHWISE_BENCH_KNOBS"  # "1": files may set BENCH_KNOB fields

_NonNegative = msgspec.Meta(ge=0)
_Positive = msgspec.Meta(gt=0)


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the key."""


class _Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pass


class ServerConfig(_Section, frozen=True):
    # The HTTP server (daemon/httpserver.py): "uvicorn" (httptools; the front's CPU per
    # streamed token was 0.75x vLLM's server's, against 1.01x on hypercorn) or
    # "hypercorn" (the design card's server; it also speaks cleartext HTTP/2, h2c).
    http: Literal["uvicorn", "hypercorn"] = "uvicorn"
    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 8000
    # Largest accepted request body, bytes; bigger bodies get 413 before decoding.
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1)] = 4 * 1024 * 1024
    # Seconds the HTTP server waits for open connections after the drain has finished.
    graceful_timeout_s: Annotated[float, _NonNegative] = 5.0
    # File of API keys (format in daemon/apikeys.py), re-read on SIGHUP; "" = no keys:
    # every client is served (bind to a trusted network only).
    api_keys_file: str = ""
    # With api_keys_file set: /metrics and /health need a key of scope monitoring (or all);
    # false leaves them open for probes and scrapers.
    protect_monitoring: bool = False
    # Listen backlog: connections the kernel queues before the daemon accepts them; a burst
    # beyond it gets connection errors (some servers default to 100). The kernel caps it at
    # net.core.somaxconn.
    backlog: Annotated[int, msgspec.Meta(ge=1)] = 4096
    # Connections with a request in flight (streams too); more get 503 + Retry-After and
    # are closed (/health, /metrics exempt). Keep it below the open-file limit (ulimit -n).
    max_connections: Annotated[int, msgspec.Meta(ge=1)] = 2048


class ModelConfig(_Section, frozen=True):
    # Folder with a HF-format model (config.json, weights, tokenizer). Relative paths are
    # resolved against the working directory.
    path: str = "models/smollm2-135m-instruct"
    # The name clients send as `model`; empty means the folder's base name.
    served_name: str = ""
    # vLLM's tool parser (its --tool-call-parser: "hermes", "llama3_json", "mistral", ...)
    # that reads tool calls out of the model's text for `tool_choice: "auto"`; "" = none
    # ("auto" is then refused with vLLM's 400; named and "required" tool choice work without
    # one). Checked at start against the model's tokenizer.
    tool_call_parser: str = ""
    # Context length in tokens (prompt + output); 0 means the model's own limit.
    max_model_len: Annotated[int, _NonNegative] = 2048

    @property
    def name(self) -> str:
        return self.served_name or Path(self.path).name


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
    default_max_tokens: Annotated[int, _NonNegative] = 0
    # Seconds SIGTERM lets running and waiting jobs finish before they are aborted.
    drain_timeout_s: Annotated[float, _NonNegative] = 30.0
    # Range [min, max] of the request field `priority` (lower = more urgent, a class ahead
    # of every job of a higher value); anything outside gets a 400.
    priority_range: tuple[int, int] = (-100, 100)

    @property
    def priority_min(self) -> int:
        return self.priority_range[0]

    @property
    def priority_max(self) -> int:
        return self.priority_range[1]


class SloConfig(_Section, frozen=True):
    # Latency objectives by request class (the request's `priority`, as a string key):
    # { "0" = { ttft_ms = 1000, tpot_ms = 50 }, "10" = { sheddable = true } }. A request's
    # x-llm-d-slo-* headers, then its API key's, win over these (daemon/http/slo.py).
    classes: dict[str, apikeys.Objective] = {}
    # Refuse (429) a request that cannot meet its objective. False: shadow mode: serve it,
    # and count what enforcement would have refused and whether it then met its objective
    # (lengthwise_slo_shadow_refusals_total), to check refusals before turning them on.
    enforce: bool = True
    # Admission refuses a request whose first token misses its objective even if it starts
    # as early, against its forecast, as this percentile of recent starts did
    # (daemon/core/forecast.py): lower refuses only surer misses. The 80th met 1.45x the
    # objectives at 2x on 6 draws but 0.82x on 3 others and 0.87x at 1.2x
    # (docs/results/2026-11-30-refuse-on-the-80th-percentile.md): the median stays.
    refuse_quantile: Annotated[float, msgspec.Meta(gt=0, lt=100), BENCH_KNOB] = 50.0
    # A forecast of the queue refuses only once this many waiting requests turned late
    # (passed their latest start) in the last 10 s, or it refused in that time: below
    # overload, refuse nothing it would serve in time (daemon/core/forecast.py). 0: refuse
    # on the forecast alone (the rule before 2026-11-29's fourteenth session).
    refuse_after_late: Annotated[int, msgspec.Meta(ge=0), BENCH_KNOB] = 1
    # With this set, it refuses on a forecast only while requests come in at least this
    # many times faster than they end (over 30 s, read at an arrival and held 10 s): late
    # jobs from a burst at light load refuse nothing (daemon/core/overload.py). 0: off.
    refuse_inflow: Annotated[float, msgspec.Meta(ge=0), BENCH_KNOB] = 0.0
    # A forecast of the wait refuses only a first token it predicts past this many times the
    # objective (1.25: 25 % over); a miss known without one (the time waited) is refused at
    # any overshoot. In shadow mode at 1.0-2x, would-be refusals predicted past 1.25x missed
    # ~95 % of the time (docs/results/2026-11-30-refusal-forecasts-and-aa.md).
    refuse_overshoot: Annotated[float, msgspec.Meta(ge=1.0), BENCH_KNOB] = 1.0
    # Where a waiting job that can no longer meet its objective waits: "in-place": where it
    # was (in slack order, by its latest start: ahead of the on-time jobs that arrived after
    # it, as in arrival order), or "behind" every job of its class that still can (the rule
    # before 2026-11-30's 21st session: fewer jobs turn late, those that do wait longer).
    # In place against behind on the same draws: p99 TTFT 0.74x / 0.85x at 0.8 / 1.2x,
    # attainment 1.21x at 1.5x and 1.15x at 2x (docs/results/2026-11-30-late-jobs-in-place.md).
    late: Annotated[Literal["behind", "in-place"], BENCH_KNOB] = "in-place"
    # Share of its TTFT budget a waiting job with an objective has left when it is promoted
    # ahead of the policy's order (earliest latest start first). 0.25 (250 ms of a 1 s
    # objective) came too late in a memory-bound burst at 0.5x, where the promoted jobs then
    # waited for room (docs/results/2026-12-01-light-load-engine-speed.md); 1: deadline
    # order from arrival.
    promote_slack: Annotated[float, msgspec.Meta(ge=0.0, le=1.0), BENCH_KNOB] = 0.25


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
    timeout_s: Annotated[float, _Positive] = 0.5
    # Torch threads for the predictor; the engines need the other cores.
    threads: Annotated[int, msgspec.Meta(ge=1)] = 1
    # JSONL file of natural completions in the predictor's record shape; "" = off.
    request_log: str = ""
    # Most requests predicted in one model call.
    max_batch: Annotated[int, msgspec.Meta(ge=1), BENCH_KNOB] = 32
    # Estimate (output tokens) used before any completion was observed, when prediction
    # is off, fails or is late; afterwards the mean of observed lengths is used.
    fallback_tokens: Annotated[float, _Positive, BENCH_KNOB] = 256.0
    # Seconds between saves of online state (the retrieval index).
    save_interval_s: Annotated[float, _Positive, BENCH_KNOB] = 60.0


class CostModelConfig(_Section, frozen=True):
    # A `lengthwise profile` JSON file (relative to the working dir) whose fitted
    # coefficients drive the policies' time estimates, the core's wait bounds and the
    # simulated engine (engine.kind = "sim"); "" = the generic cost model
    # (daemon/core/costmodel.py). Read at start and on reload.
    profile: str = ""


class LogConfig(_Section, frozen=True):
    level: Literal["debug", "info", "warning", "error"] = "info"


class Config(_Section, frozen=True):
    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    engine: EngineConfig = msgspec.field(default_factory=EngineConfig)
    scheduler: SchedulerConfig = msgspec.field(default_factory=SchedulerConfig)
    policies: PoliciesConfig = msgspec.field(default_factory=PoliciesConfig)
    limits: LimitsConfig = msgspec.field(default_factory=LimitsConfig)
    slo: SloConfig = msgspec.field(default_factory=SloConfig)
    costmodel: CostModelConfig = msgspec.field(default_factory=CostModelConfig)
    predictor: PredictorConfig = msgspec.field(default_factory=PredictorConfig)
    kvstore: KVStoreConfig = msgspec.field(default_factory=KVStoreConfig)
    log: LogConfig = msgspec.field(default_factory=LogConfig)


# Sections a running daemon cannot change; a reload that changes them keeps the old ones.
RESTART_ONLY = ("server", "model", "engine", "predictor", "kvstore")


def decode(text: str | bytes, source: str = "<config>", *, bench_knobs: bool = False) -> Config:
    """The tree from TOML text, validated. `bench_knobs`: the text may set BENCH_KNOB fields
    (bench commands' configs); otherwise naming one is an error, as an unknown key is."""
    try:
        tree = msgspec.toml.decode(text)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{source}: malformed TOML: {exc}") from None
    named = [] if bench_knobs else [key for key in bench_knob_keys() if _lookup(tree, key)]
    if named:
        raise ConfigError(f"{source}: " + "; ".join(
            f"{key}: unknown key (a benchmark knob; docs/benchmarks.md)" for key in named))
    try:
        config = msgspec.convert(tree, type=Config)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {key_error(exc, tree)}") from None
    validate(config, source)
    policy = config.scheduler.policy
    if not bench_knobs and registry.benchmark_only(policy):
        raise ConfigError(f"{source}: scheduler.policy {policy!r} needs true lengths, which "
                          "only benchmarks know (docs/benchmarks.md)")
    return config


def load(path: str | os.PathLike[str]) -> Config:
    """The file at `path`, validated with the files it names (API keys, cost profile)."""
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    config = decode(text, str(path), bench_knobs=os.environ.get(BENCH_KNOBS_ENV) == "1")
    if config.server.api_keys_file:
        try:
            apikeys.load(config.server.api_keys_file)
        except apikeys.KeyFileError as exc:
            raise ConfigError(f"{path}: server.api_keys_file: {exc}") from None
    return config


def validate(config: Config, source: str) -> None:
    """What spans sections or rooms, which a field's own constraint cannot say."""
    problems = []
    fixed = config.scheduler.fixed_running
    if fixed is not None and fixed > config.engine.max_num_seqs:
        problems.append("scheduler.max_running must be <= engine.max_num_seqs")
    if config.scheduler.policy not in registry.names():
        problems.append(
            f"scheduler.policy {config.scheduler.policy!r} is not one of {registry.names()}")
    aging = config.scheduler.aging
    if aging.min_wait_s > aging.promote_after_s:
        problems.append("scheduler.aging.min_wait_s must be <= promote_after_s")
    if config.limits.priority_min > config.limits.priority_max:
        problems.append("limits.priority_range must be [min, max] with min <= max")
    problems += [f"slo.classes.{name}: a class is a request priority (an integer)"
                 for name in config.slo.classes if not re.fullmatch(r"-?\d+", name)]
    problems += [f"engine.vllm_args.{name}: set by lengthwise, not here (etc/lengthwise.toml)"
                 for name in sorted(OWN_VLLM_ARGS & config.engine.vllm_args.keys())]
    try:
        cost_profile(config)
    except ConfigError as exc:
        problems.append(str(exc))
    if problems:
        raise ConfigError(f"{source}: " + "; ".join(problems))


def restart_only_changes(old: Config, new: Config) -> list[str]:
    """Names of restart-only sections that differ between two trees."""
    return [name for name in RESTART_ONLY if getattr(old, name) != getattr(new, name)]


class _ProfileFile(msgspec.Struct):
    """The part of a profile file (bench/costfile.Profile) the daemon reads."""

    sim: SimConfig


def cost_profile(config: Config) -> SimConfig:
    """The engine's cost coefficients: `[costmodel] profile`'s, or the generic ones. Read at
    start and on every reload; a missing or malformed file is a ConfigError."""
    path = config.costmodel.profile
    if not path:
        return SimConfig()
    try:
        return msgspec.json.decode(Path(path).read_bytes(), type=_ProfileFile).sim
    except OSError as exc:
        raise ConfigError(f"costmodel.profile: cannot read {path}: {exc.strerror}") from None
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ConfigError(f"costmodel.profile: {path} is not a cost profile: {exc}") from None


def slots_per_engine(config: Config) -> int:
    """Jobs one executor may run at once by count: scheduler.max_running, or under "auto"
    engine.max_num_seqs (memory admission then admits fewer where the KV cache is short)."""
    return config.scheduler.fixed_running or config.engine.max_num_seqs


def cost_model(config: Config) -> CostModel:
    """What the policies and the core's aging estimate seconds with."""
    return CostModel.from_sim(cost_profile(config))


@functools.cache
def bench_knob_keys() -> tuple[str, ...]:
    """Dotted keys of every BENCH_KNOB field in the tree."""
    return tuple(_marked(msgspec.inspect.type_info(Config), ""))


def _marked(node: msgspec.inspect.Type, prefix: str) -> list[str]:
    found: list[str] = []
    for field in getattr(node, "fields", ()):
        kind, key = field.type, f"{prefix}{field.encode_name}"
        if isinstance(kind, msgspec.inspect.Metadata):
            if (kind.extra or {}).get("bench_knob"):
                found.append(key)
            kind = kind.type
        if isinstance(kind, msgspec.inspect.StructType):
            found += _marked(kind, key + ".")
    return found


_LOCATED = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>[^`]*)`$")
_STEP = re.compile(r"\.([^.\[\]]+)|\[(\d+)\]")


def key_error(exc: msgspec.ValidationError, tree: dict[str, Any]) -> str:
    """msgspec's message led by the dotted key and the value given
    ("scheduler.aging.slowdown = -1: Expected `float` >= 0.0") instead of its JSON path."""
    match = _LOCATED.match(str(exc))
    assert match is not None  # the pattern matches any text
    what, path = match["what"], (match["path"] or "")
    key = path.lstrip(".")
    if unknown := _UNKNOWN.match(what):
        return f"{key + '.' if key else ''}{unknown['name']}: unknown key"
    found, value = _walk(tree, path)
    return f"{key} = {value!r}: {what}" if found else f"{key}: {what}"


def _lookup(tree: dict[str, Any], key: str) -> bool:
    return _walk(tree, "." + key)[0]


def _walk(tree: Any, path: str) -> tuple[bool, Any]:
    """The value at a msgspec path (".a.b[2]") in the decoded TOML, if it is there."""
    node = tree
    for name, index in _STEP.findall(path):
        if name and isinstance(node, dict) and name in node:
            node = node[name]
        elif index and isinstance(node, list) and int(index) < len(node):
            node = node[int(index)]
        else:
            return False, None
    return True, node
