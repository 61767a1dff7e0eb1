"""Helpers for tests that run the real daemon: as a subprocess, or its app in-process."""

from __future__ import annotations

import asyncio
import contextlib
import encodings.idna  # noqa: F401  (see httpcore below)
import json
import os
import signal
import subprocess
import sys
import time
import tracemalloc  # noqa: F401  (see httpcore below)
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

# httpcore, tracemalloc and encodings.idna imported here, once, not lazily mid-test: httpx
# imports httpcore (and the host's IDNA codec) on its first request, and on CPython 3.11 an
# import that a garbage collector's finalizer interrupts with a first import of its own
# (warnings.py imports tracemalloc when it first shows a warning with a source, such as an
# unclosed socket's) ends in "KeyError: <thread id>" (cpython#91351, fixed in 3.12): CI's
# session daemon fixture died of it once, inside wait_ready's first httpx.get; which
# finalizer interrupted it is not known.
import httpcore  # noqa: F401
import httpx
import pytest

from bench import promtext
from bench.servers import free_port
from daemon.config import Config, EngineConfig, ModelConfig, SchedulerConfig
from daemon.core.forecast import Forecaster
from daemon.core.promises import MIN_ERRORS
from daemon.core.stream import JobEnd, OutputStream, TokenDelta
from daemon.http.app import build_app
from daemon.service import Service
from tests.warmstart import WarmProcess

if TYPE_CHECKING:
    import openai

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = ROOT / "models" / "smollm2-135m-instruct"
TINY = ROOT / "models" / "tiny-llama"
# The team's shared data, beside the repository (never an absolute path).
SHARED_DATA = ROOT.parent / "shared" / "data"
AZURE_CONV = SHARED_DATA / "azure_llm_2023_conv.csv"
LENGTHWISE = Path(sys.executable).parent / "lengthwise"
# The environment of a daemon whose config sets benchmark knobs (daemon/config.py).
BENCH_KNOBS = {"LENGTHWISE_BENCH_KNOBS": "1"}


@contextlib.asynccontextmanager
async def in_process(config: Config) -> AsyncIterator[tuple[httpx.AsyncClient, Service]]:
    """The daemon's app in this process (ASGI, no socket) on `config`: a client and its
    service, shut down afterwards."""
    service = await Service.create(config)
    await service.start()
    try:
        transport = httpx.ASGITransport(app=build_app(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            yield http, service
    finally:
        await service.shutdown()


def sim_config(model: Path, max_model_len: int) -> Config:
    """The daemon on the simulated engine (2 slots) with `model`'s tokenizer: for tests of
    the HTTP layer in-process."""
    return Config(model=ModelConfig(path=str(model), max_model_len=max_model_len),
                  engine=EngineConfig(kind="sim", max_num_seqs=2),
                  scheduler=SchedulerConfig(max_running=2))


def config_text(model: Path, port: int, *, engine_kind: str = "vllm", max_running: int = 4,
                max_num_seqs: int = 4, drain_timeout_s: float = 30.0, policy: str = "fcfs",
                dtype: str = "auto", max_waiting: int = 1024, tool_call_parser: str = "",
                http: str = "uvicorn", extra: str = "") -> str:
    return f"""
[server]
http = "{http}"
port = {port}
[model]
path = "{model}"
max_model_len = 2048
tool_call_parser = "{tool_call_parser}"
[engine]
kind = "{engine_kind}"
max_num_seqs = {max_num_seqs}
cpu_kv_cache_gib = 1
vllm_args = {{ dtype = "{dtype}" }}
[scheduler]
policy = "{policy}"
max_running = {max_running}
max_waiting = {max_waiting}
[limits]
drain_timeout_s = {drain_timeout_s}
{extra}
"""


def listen_backlog(port: int) -> int:
    """The backlog of the socket listening on `port`: its Send-Q in `ss -ltn`."""
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True,
                         check=True).stdout.split()
    return int(out[2])


def sim_profile(path: Path, **costs: float) -> str:
    """The [costmodel] lines for a cost profile with these `sim` coefficients, written to
    `path`: what the simulated engine (engine.kind = "sim") runs and the policies use."""
    path.write_text(json.dumps({"sim": costs}))
    return f'[costmodel]\nprofile = "{path}"\n'


class DaemonProcess:
    """`lengthwise serve` in a subprocess, with its log in a file for post-mortems: forked
    from this worker's warm interpreter (tests/warmstart.py), or, `warm=False`, started cold
    from the console script as users start it."""

    def __init__(self, config_path: Path, log_path: Path, env: dict[str, str] | None = None,
                 warm: bool = True):
        self.config_path = config_path
        self.log_path = log_path
        text = config_path.read_text()
        self.port = int(text.split("port = ", 1)[1].split()[0])
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._log = open(log_path, "wb")  # noqa: SIM115 - lives as long as the process
        argv = ["serve", "--config", str(config_path)]
        environ = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
        self.proc: subprocess.Popen[bytes] | WarmProcess
        if warm:
            self.proc = WarmProcess(argv, environ, log_path, ROOT)
            return
        self.proc = subprocess.Popen(
            [str(LENGTHWISE), *argv], stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT,
            env=environ,
            # A process group of its own, so a kill takes the engine along; not a session of
            # its own: with the kernel's autogroup scheduling a new session is a CPU group of
            # its own, where the engine's busy CPU worker starves the daemon's event loop
            # (on 2 cores, /metrics took 4 s to answer and requests reached it seconds late).
            process_group=0,
        )

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"daemon not ready after {timeout_s} s:\n{self.log()}")

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def reload(self, text: str, timeout_s: float = 30.0) -> None:
        """Write `text` as the config and SIGHUP; return once the daemon has reloaded it."""
        self.config_path.write_text(text)
        seen = self._reloads()
        self.signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout_s
        while self._reloads() <= seen:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reload not seen:\n{self.log()}")
            time.sleep(0.1)

    def _reloads(self) -> int:
        """Reloads the daemon logged, counted over its whole log (log() is its tail, where
        older reload lines scroll out as a shared daemon serves)."""
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace").count("reloaded ")

    def reload_policy(self, policy: str, timeout_s: float = 30.0) -> None:
        """Rewrite the config's policy and SIGHUP; return once the daemon runs it."""
        text = self.config_path.read_text()
        head, tail = text.split('policy = "', 1)
        self.reload(head + f'policy = "{policy}' + tail[tail.index('"'):], timeout_s)

    def stop(self, timeout_s: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)  # daemon and engine processes
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def wait_log(self, text: str, timeout_s: float = 30.0) -> None:
        """Return once the daemon has logged `text` (a line can follow the moment /health
        answers 200: "ready" is logged after start-up's last garbage collection)."""
        deadline = time.monotonic() + timeout_s
        while text not in self.log():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{text!r} not logged after {timeout_s} s:\n{self.log()}")
            time.sleep(0.1)

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-20000:]

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples named `name` that carry `labels`."""
        return promtext.total(httpx.get(self.base_url + "/metrics", timeout=5).text, name,
                              **labels)


def learn_forecast_errors(forecast: Forecaster, ratio: float = 1.0,
                          memory: bool = False) -> None:
    """As if MIN_ERRORS promised starts had just come `ratio` x their forecast waits (of the
    work ahead, or `memory`'s bound): admission refuses on a forecast only once its error is
    learned."""
    for _ in range(MIN_ERRORS):
        forecast.promises.record(memory, forecast.now(), ratio)


async def read_to_end(stream: OutputStream, timeout_s: float = 120.0
                      ) -> tuple[list[TokenDelta], JobEnd]:
    """Every delta a job's output stream gives, and its end."""
    deltas: list[TokenDelta] = []
    while True:
        item = await asyncio.wait_for(stream.next(), timeout_s)
        if isinstance(item, JobEnd):
            return deltas, item
        deltas.append(item)


def openai_client(daemon: DaemonProcess) -> openai.OpenAI:
    """The openai client on `daemon`, to use in a `with` block, which closes it. (An unclosed
    client's pooled socket is a ResourceWarning, an error here, raised in whichever later
    test the garbage collector happens to find it.)"""
    import openai

    return openai.OpenAI(base_url=daemon.base_url + "/v1", api_key="unused", max_retries=0)


def require_model(model: Path) -> None:
    if not (model / "config.json").exists():
        pytest.fail(f"{model} is missing: run `make models` (make test does it)")


@contextlib.contextmanager
def starting_daemon(folder: Path, model: Path, env: dict[str, str] | None = None,
                    **config: object) -> Iterator[DaemonProcess]:
    """A daemon started for the block, not yet ready (the caller waits when it needs it, and
    may start something else meanwhile); it must then stop cleanly (exit 0)."""
    require_model(model)
    path = folder / "lengthwise.toml"
    path.write_text(config_text(model, free_port(), **config))  # type: ignore[arg-type]
    daemon = DaemonProcess(path, folder / "daemon.log", env)
    try:
        yield daemon
    finally:
        code = daemon.stop()
        assert code == 0, daemon.log()


@contextlib.contextmanager
def running_daemon(folder: Path, model: Path, env: dict[str, str] | None = None,
                   **config: object) -> Iterator[DaemonProcess]:
    """A ready daemon for the block; it must then stop cleanly (exit 0)."""
    with starting_daemon(folder, model, env, **config) as daemon:
        daemon.wait_ready()
        yield daemon


# Aging in seconds (slowdown 4 typical services) for simulator tests on one slot that are
# about something else than aging: there the default's place bound (2 x 1) lets only two
# shorts pass a long job (tests/policies/test_aging.py tests aging).
SECONDS_AGING = ["scheduler.aging.overtaking=false", "scheduler.aging.slowdown=4"]
