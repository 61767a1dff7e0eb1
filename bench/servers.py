"""The systems `bench compare` starts in turn: vLLM's own OpenAI server (FCFS or priority)
and lengthwise with one policy, on the same model, engine settings and max_num_seqs."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import NamedTuple

import httpx
import msgspec

from bench import promtext


class System(msgspec.Struct, frozen=True):
    spec: str  # as given: vllm | vllm-priority | lengthwise:POLICY[+KEY=VALUE...]
    kind: str  # "vllm" | "lengthwise"
    policy: str  # lengthwise policy, or vLLM's scheduling policy
    # What the client sends as `priority`: vLLM's priority scheduler has no predictor, so
    # it gets the true length as priority (an oracle hint: its best case).
    client_priority: str
    # lengthwise config overrides of this system alone: dotted key -> TOML value text
    # (`lengthwise:blend+policies.blend.beta=2+scheduler.engine_queue=1`).
    overrides: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        """The spec as a file name part."""
        return self.spec.replace(":", "-").replace("+", "_").replace("=", "-")


def parse_system(spec: str) -> System:
    if spec == "vllm" or spec.startswith("vllm#"):  # vllm#2: its A/A, under its own name
        return System(spec, "vllm", "fcfs", "none")
    if spec == "vllm-priority":
        return System(spec, "vllm", "priority", "length")
    kind, _, rest = spec.partition(":")
    policy, *sets = rest.split("+")
    if kind == "lengthwise" and policy:
        overrides = tuple(tuple(item.split("=", 1)) for item in sets)
        if any(len(pair) != 2 or not pair[0] for pair in overrides):
            raise ValueError(f"{spec!r}: overrides are +KEY=VALUE (dotted keys)")
        return System(spec, "lengthwise", policy, "none",
                      overrides=overrides)  # type: ignore[arg-type]
    raise ValueError(f"unknown system {spec!r}: vllm | vllm#N | vllm-priority | "
                     "lengthwise:POLICY")


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    model: Path
    max_num_seqs: int = 4
    # lengthwise's [scheduler] max_running: "auto" (memory admission, the daemon's default)
    # or a number of jobs per engine.
    max_running: str = "auto"
    max_model_len: int = 2048
    kv_gib: int = 1
    dtype: str = "auto"
    # KV blocks instead of what vLLM sizes from kv_gib (0: vLLM's sizing): memory pressure.
    num_gpu_blocks_override: int = 0
    # Cores for every engine's OpenMP threads (VLLM_CPU_OMP_THREADS_BIND, e.g. "0-1"); "":
    # as inherited (vLLM's "auto" reserves one core of the node unless a KV connector is
    # configured, which needs two: on a 2-core host an engine with one binds both cores).
    cpu_bind: str = ""
    # Appended to every lengthwise config ([predictor] path, ...); benchmark knobs allowed:
    # the daemon runs with LENGTHWISE_BENCH_KNOBS=1 (daemon/config.py).
    extra_toml: str = ""
    # False when the client forces each length through max_tokens: the daemon must not
    # read the truth off the budget (the benchmark knob scheduler.trust_budget).
    trust_budget: bool = True
    startup_timeout_s: float = 900.0  # a shared machine under load starts engines slowly
    # More flags for vLLM's server alone (`--tool-call-parser pythonic`, ...).
    vllm_flags: tuple[str, ...] = ()
    # More environment for vLLM's server alone (name, value): a test that only needs its
    # answers runs the model in the EngineCore, without a worker process
    # (VLLM_ENABLE_V1_MULTIPROCESSING=0).
    vllm_env: tuple[tuple[str, str], ...] = ()
    # lengthwise's [engine] kind: "vllm", or "sim" (the simulated engine: tests of a
    # harness, no vLLM server beside it).
    engine_kind: str = "vllm"
    # Every engine logs each step's batch and time (vLLM's enable_logging_iteration_details;
    # in lengthwise's log too): the engines' own step times, pair by pair.
    step_log: bool = False
    # lengthwise writes its core's trace (each admission forecast, launch and stop) beside
    # its log, WORKDIR/LABEL[-REPEAT].trace.jsonl ([scheduler] trace; bench.forecasterrors).
    trace: bool = False


_PICK = random.SystemRandom()  # not the `random` module's: a test may seed that one
_LOWEST_PORT = 10000


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a server about to start: picked at random below
    the kernel's ephemeral range, where no outgoing connection takes it in the meantime. A
    port from bind(0) is an ephemeral one, drawn from the same range as every client's
    connection and the other test worker's picks: a test daemon found its port taken once
    ("Address already in use")."""
    low = _ephemeral_low()
    for _ in range(100 if low > _LOWEST_PORT else 0):
        port = _PICK.randrange(_LOWEST_PORT, low)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out to outgoing connections (Linux; else 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# The tables _lengthwise_config writes itself: overrides of their keys go inside them (TOML
# refuses a table defined twice), and replace the keys it writes (a key defined twice too).
_BASE_TABLES = ("server", "engine", "scheduler")


def _overrides_toml(overrides: tuple[tuple[str, str], ...]
                    ) -> tuple[dict[str, dict[str, str]], str]:
    """(each base table's overridden keys: name -> TOML value, other tables as TOML text)
    for a system's overrides."""
    tables: dict[str, dict[str, str]] = {}
    for key, value in overrides:
        table, _, name = key.rpartition(".")
        try:
            tomllib.loads(f"v = {value}")
        except tomllib.TOMLDecodeError:
            value = f'"{value}"'  # a bare word: a string
        tables.setdefault(table, {})[name] = value
    base = {name: tables.pop(name, {}) for name in _BASE_TABLES}
    return base, "".join(_table(table, {}, lines) for table, lines in tables.items())


def _table(name: str, keys: dict[str, str], overrides: dict[str, str]) -> str:
    """A TOML table of `keys` with `overrides` replacing or adding to them."""
    return f"[{name}]\n" + "".join(f"{k} = {v}\n" for k, v in {**keys, **overrides}.items())


def _lengthwise_config(system: System, s: Settings, port: int, trace: Path | None = None
                       ) -> str:
    base, tables = _overrides_toml(system.overrides)
    server = _table("server", {"port": str(port)}, base["server"])
    scheduler = _table("scheduler", {
        "policy": f'"{system.policy}"', "max_running": _max_running(s),
        "max_waiting": "100000", "trust_budget": str(s.trust_budget).lower(),
        **({"trace": f'"{trace}"'} if trace is not None else {})},
        base["scheduler"])
    engine = _table("engine", {
        "kind": f'"{s.engine_kind}"', "max_num_seqs": str(s.max_num_seqs),
        "cpu_kv_cache_gib": str(s.kv_gib), "vllm_args": f"{{ {_vllm_args(s)} }}"},
        base["engine"])
    return f"""
{server}
[model]
path = "{s.model}"
max_model_len = {s.max_model_len}
{engine}
{scheduler}
{tables}
{s.extra_toml}
"""


def _max_running(s: Settings) -> str:
    return '"auto"' if s.max_running == "auto" else str(int(s.max_running))


def _vllm_args(s: Settings) -> str:
    """[engine] vllm_args: the engine settings vLLM's own server gets as flags."""
    args = f'dtype = "{s.dtype}"'
    if s.num_gpu_blocks_override:
        args += f", num_gpu_blocks_override = {s.num_gpu_blocks_override}"
    if s.step_log:
        args += ", enable_logging_iteration_details = true"
    return args


def command(system: System, s: Settings, port: int, workdir: Path, suffix: str = ""
            ) -> list[str]:
    """The command line that starts `system` (a lengthwise config is written to workdir;
    its trace, with `s.trace`, is WORKDIR/LABEL`suffix`.trace.jsonl)."""
    if system.kind == "lengthwise":
        config = workdir / f"{system.label}.toml"
        trace = (workdir / f"{system.label}{suffix}.trace.jsonl").resolve() if s.trace else None
        config.write_text(_lengthwise_config(system, s, port, trace))
        return [str(Path(sys.executable).parent / "lengthwise"), "serve", "--config", str(config)]
    # Prefix caching is vLLM's default; explicit, as in the daemon's [engine].
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(s.model),
           "--max-num-seqs", str(s.max_num_seqs), "--max-model-len", str(s.max_model_len),
           "--dtype", s.dtype, "--enable-prefix-caching",
           "--enforce-eager", "--port", str(port), "--host", "127.0.0.1",
           "--served-model-name", s.model.name]
    if s.num_gpu_blocks_override:
        cmd += ["--num-gpu-blocks-override", str(s.num_gpu_blocks_override)]
    if system.policy == "priority":
        cmd += ["--scheduling-policy", "priority"]
    if s.step_log:
        cmd += ["--enable-logging-iteration-details"]
    return cmd + list(s.vllm_flags)


def environment(s: Settings, system: System | None = None) -> dict[str, str]:
    """The environment of a server of `system` (vLLM's server gets Settings.vllm_env too)."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(s.kv_gib),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           # lengthwise's config may set benchmark knobs (trust_budget, a policy's tuning)
           "LENGTHWISE_BENCH_KNOBS": "1",
           # /v1/responses keeps responses (previous_response_id, background) as lengthwise
           # does by default; without it vLLM's server silently drops `store`.
           "VLLM_ENABLE_RESPONSES_API_STORE": "1"}
    if s.cpu_bind:
        env["VLLM_CPU_OMP_THREADS_BIND"] = s.cpu_bind
    if system is not None and system.kind == "vllm":
        env.update(s.vllm_env)
    return env


class Counters(NamedTuple):
    """A server's counters that a run's figures read (differences over the run)."""

    engine_preemptions: float  # the engine's own (vLLM's vllm:num_preemptions_total)
    policy_preemptions: float  # lengthwise's (0 for vLLM's server)
    refused: float  # requests the server answered 429 (lengthwise; 0 for vLLM's server)
    # lengthwise's own account of its waits ({} for vLLM's server), keyed
    # "held:REASON" (lengthwise_admission_held_total: decision rounds that left the next
    # job waiting with room for it now, by the rule that held it), "ttft_s:PHASE" and
    # "ttft_n:PHASE" (lengthwise_ttft_phase_seconds' sum and count: predict, queue,
    # engine), "shadow:OUTCOME" (lengthwise_slo_shadow_refusals_total: met, missed),
    # "shadow_by:CAUSE/OUTCOME" (the same by cause: ttft:queue, ttft:memory, ttft:none,
    # tpot), "refused_by:CAUSE" (lengthwise_slo_refusals_total), "overshoot:OUTCOME/LE"
    # (lengthwise_slo_shadow_overshoot's buckets: would-be refusals predicted at most LE x
    # their objective; "+Inf" counts them all),
    # "lag:LE" (lengthwise_event_loop_lag_seconds' buckets: probes of the event loop, every
    # 0.1 s, that fired at most LE seconds late; "lag:+Inf" counts them all).
    waits: dict[str, float]

    def __sub__(self, before: Counters) -> Counters:  # type: ignore[override]
        return Counters(self.engine_preemptions - before.engine_preemptions,
                        self.policy_preemptions - before.policy_preemptions,
                        self.refused - before.refused,
                        {k: v - before.waits.get(k, 0.0) for k, v in self.waits.items()})


def _waits(text: str) -> dict[str, float]:
    """Counters.waits from a /metrics text."""
    waits: dict[str, float] = {}
    for prefix, name, *labels in (
            ("held", "lengthwise_admission_held_total", "reason"),
            ("ttft_s", "lengthwise_ttft_phase_seconds_sum", "phase"),
            ("ttft_n", "lengthwise_ttft_phase_seconds_count", "phase"),
            ("shadow", "lengthwise_slo_shadow_refusals_total", "outcome"),
            ("shadow_by", "lengthwise_slo_shadow_refusals_total", "cause", "outcome"),
            ("refused_by", "lengthwise_slo_refusals_total", "cause"),
            ("overshoot", "lengthwise_slo_shadow_overshoot_bucket", "outcome", "le"),
            ("lag", "lengthwise_event_loop_lag_seconds_bucket", "le")):
        for value, count in promtext.by_label(text, name, *labels).items():
            waits[f"{prefix}:{value}"] = count
    return waits


def describe_waits(waits: dict[str, float]) -> str:
    """"; held: wait-is-cheaper 120, policy 3; to first token: predict 12 / queue 840 /
    engine 310 ms mean; shadow refusals: met 2, missed 9; event loop late > 25 ms 14, > 50 ms
    3, > 100 ms 0, > 1000 ms 0 of 2400 probes" ("" where nothing was counted; a probe late
    by more than a second is a stall the server log names with its stack)."""
    parts = []
    held = {k[5:]: v for k, v in waits.items() if k.startswith("held:") and v}
    if held:
        parts.append("held: " + ", ".join(f"{k} {v:g}" for k, v in sorted(held.items())))
    phases = [(p, waits.get(f"ttft_s:{p}", 0.0), waits.get(f"ttft_n:{p}", 0.0))
              for p in ("predict", "queue", "engine")]
    if any(n for _, _, n in phases):
        parts.append("to first token: " + " / ".join(
            f"{p} {1000 * s / n:.0f}" for p, s, n in phases if n) + " ms mean")
    shadow = {k[7:]: v for k, v in waits.items() if k.startswith("shadow:") and v}
    if shadow:
        parts.append("shadow refusals: " + ", ".join(f"{k} {v:g}"
                                                     for k, v in sorted(shadow.items())))
    if probes := waits.get("lag:+Inf", 0.0):
        parts.append("event loop late " + ", ".join(
            f"> {1000 * float(le):g} ms {probes - waits.get(f'lag:{le}', probes):g}"
            for le in ("0.025", "0.05", "0.1", "1.0")) + f" of {probes:g} probes")
    return "".join(f"; {part}" for part in parts)


class Server:
    """One system in a subprocess (its own process group: vLLM spawns an engine process)."""

    def __init__(self, system: System, settings: Settings, workdir: Path,
                 log_suffix: str = "") -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        # WORKDIR/LABEL.log; a caller that starts the same system again (the sweep, once
        # per repetition) names each start's log apart, so that none overwrites another.
        self.log_path = workdir / f"{system.label}{log_suffix}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (open while the server runs)
        # A process group of its own (vLLM spawns engine processes; stop() signals them
        # all) but the client's session: a new session is a new scheduler autogroup on
        # Linux, and with the server's busy engine threads in their own group the daemon's
        # and the client's wake-ups lag (measured: mean TTFT 19 ms -> 252 ms at 3 req/s on
        # the tiny model, docs/benchmarks.md).
        self.proc = subprocess.Popen(command(system, settings, self.port, workdir, log_suffix),
                                     stdout=self._log, stderr=subprocess.STDOUT,
                                     env=environment(settings, system),
                                     process_group=0)
        self.timeout_s = settings.startup_timeout_s

    def wait_ready(self) -> float:
        """Seconds until /health answers 200 and a model is listed."""
        started = time.monotonic()
        while time.monotonic() - started < self.timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; "
                                   f"see {self.log_path}")
            try:
                if (httpx.get(self.base_url + "/health", timeout=2).status_code == 200
                        and httpx.get(self.base_url + "/v1/models", timeout=2).is_success):
                    return time.monotonic() - started
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"server not ready after {self.timeout_s} s; see {self.log_path}")

    def counters(self) -> Counters:
        """The server's preemption and refusal counters so far (both servers export vLLM's
        `vllm:num_preemptions_total`; the refusals are lengthwise's 429s, which vLLM's
        client records without a reason, so only the server can count them)."""
        text = httpx.get(self.base_url + "/metrics", timeout=10).text
        return Counters(promtext.total(text, "vllm:num_preemptions_total"),
                        promtext.total(text, "lengthwise_preemptions_total"),
                        promtext.total(text, "lengthwise_http_errors_total", status="429"),
                        _waits(text))

    def stop(self, timeout_s: float = 60.0) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
