"""Signals and sd_notify on the real daemon: readiness, watchdog, reload, drain; the drain
and the start's bind error on both HTTP servers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from daemon import config as config_mod
from daemon import lifecycle
from tests.support import DaemonProcess, config_text, free_port, sim_profile

pytestmark = pytest.mark.engine


class NotifySocket:
    """What systemd does: bind a datagram socket and read, all the time, what is sent."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.1)
        self._received: queue.Queue[str] = queue.Queue()
        self._closed = threading.Event()
        self._reader = threading.Thread(target=self._read_forever, daemon=True)
        self._reader.start()
        self.messages: list[str] = []

    def _read_forever(self) -> None:
        while not self._closed.is_set():
            try:
                self._received.put(self.sock.recv(4096).decode())
            except (TimeoutError, OSError):
                continue

    def close(self) -> None:
        self._closed.set()
        self._reader.join()
        self.sock.close()

    def read(self, until: str, timeout_s: float = 30.0) -> list[str]:
        """Collect messages until one contains `until`; return all seen so far."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                self.messages.append(self._received.get(timeout=0.1))
            except queue.Empty:
                continue
            if until in self.messages[-1]:
                return self.messages
        raise TimeoutError(f"no {until!r} in {self.messages}")


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifySocket]:
    sock = NotifySocket(tmp_path / "notify.sock")
    yield sock
    sock.close()


def _start(tmp_path: Path, model: Path, notify: NotifySocket, engine_kind: str = "vllm",
           drain_timeout_s: float = 30.0, http: str = "uvicorn", extra: str = "",
           server: str = "") -> DaemonProcess:
    config = tmp_path / "lengthwise.toml"
    text = config_text(model, free_port(), engine_kind=engine_kind,
                       drain_timeout_s=drain_timeout_s, http=http, extra=extra)
    config.write_text(text.replace("[server]\n", "[server]\n" + server, 1))
    env = {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "400000"}
    return DaemonProcess(config, tmp_path / "daemon.log", env)


def _stream_body(max_tokens: int) -> dict[str, object]:
    return {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}],
            "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
            "stream_options": {"include_usage": True}}


def test_notify_reload_and_sigterm_drain(tmp_path: Path, tiny_model: Path,
                                         notify: NotifySocket) -> None:
    daemon = _start(tmp_path, tiny_model, notify)
    try:
        daemon.wait_ready()
        assert notify.read("READY=1")[-1].startswith("READY=1")
        notify.messages.clear()
        assert notify.read("WATCHDOG=1", timeout_s=3)  # every 0.2 s (half of WATCHDOG_USEC)

        daemon.signal(signal.SIGHUP)
        seen = notify.read("RELOADING=1")
        assert "MONOTONIC_USEC=" in seen[-1]
        notify.read("READY=1")

        with httpx.stream("POST", daemon.base_url + "/v1/chat/completions",
                          json=_stream_body(1500), timeout=120) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            daemon.signal(signal.SIGTERM)
            notify.read("STOPPING=1")
            refused = _try_request(daemon)
            rest = [line for line in lines if line]
        assert refused in (503, "connection refused")
        assert rest[-1] == "data: [DONE]"
        assert '"completion_tokens":1500' in rest[-2]  # the running stream finished whole
        assert daemon.proc.wait(60) == 0
    finally:
        daemon.stop()


def _try_request(daemon: DaemonProcess, model: str = "tiny-llama") -> int | str:
    try:
        return httpx.post(daemon.base_url + "/v1/chat/completions", timeout=10,
                          json={"model": model, "max_tokens": 1,
                                "messages": [{"role": "user", "content": "hi"}]}).status_code
    except httpx.ConnectError:
        return "connection refused"


SERVERS = ["uvicorn", "hypercorn"]


@pytest.mark.parametrize("http", SERVERS)
def test_sigterm_drains_then_stops(http: str, tmp_path: Path, smollm2_model: Path,
                                   notify: NotifySocket) -> None:
    """On either HTTP server (simulated engine: fast start): after SIGTERM new requests are
    refused, a stream that fits the drain limit finishes whole, one longer is cut
    ('abort', then [DONE]), and a connection still sending its request gets
    server.graceful_timeout_s before the server closes it; then exit 0."""
    slow = sim_profile(tmp_path / "slow.json", decode_base_s=0.05)
    daemon = _start(tmp_path, smollm2_model, notify, engine_kind="sim", drain_timeout_s=DRAIN_S,
                    http=http, extra=slow + '[predictor]\npath = "none"\n',
                    server=f"graceful_timeout_s = {GRACE_S}\n")
    try:
        daemon.wait_ready(120)
        body = {**_stream_body(1000), "model": MODEL}
        with (httpx.stream("POST", daemon.base_url + "/v1/chat/completions", json=body,
                           timeout=60) as long,
              httpx.stream("POST", daemon.base_url + "/v1/chat/completions",
                           json={**body, "max_tokens": 8}, timeout=60) as short,
              _sending_a_request(daemon.port) as sending):
            long_lines, short_lines = long.iter_lines(), short.iter_lines()
            assert next(long_lines).startswith("data: ") and next(short_lines).startswith("data: ")
            daemon.signal(signal.SIGTERM)
            notify.read("STOPPING=1")
            assert _try_request(daemon, MODEL) in (503, "connection refused")
            finished = [line for line in short_lines if line]
            cut = [line for line in long_lines if line]
            cut_at = time.monotonic()
            closed_after_s = _wait_closed(sending) - cut_at
        assert finished[-1] == "data: [DONE]" and '"completion_tokens":8' in finished[-2]
        assert '"finish_reason":"abort"' in cut[-3] and cut[-1] == "data: [DONE]"
        assert GRACE_S * 0.75 <= closed_after_s < GRACE_S + 10, closed_after_s
        assert daemon.proc.wait(30) == 0
        assert "drain timed out; aborting 1 jobs" in daemon.log()
    finally:
        daemon.stop()


DRAIN_S = 3.0
GRACE_S = 2.0
MODEL = "smollm2-135m-instruct"


@contextlib.contextmanager
def _sending_a_request(port: int) -> Iterator[socket.socket]:
    """A connection whose request is accepted but whose body never comes whole."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        yield sock


def _wait_closed(sock: socket.socket) -> float:
    """When the server ended the connection (whatever it sent before)."""
    while sock.recv(65536):
        pass
    return time.monotonic()


@pytest.mark.parametrize("http", SERVERS)
def test_a_taken_port_fails_the_start_at_once(http: str, tmp_path: Path,
                                              smollm2_model: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    """The daemon binds its socket itself, first: a port in use is an error (status 1)
    before anything starts, on either server (uvicorn alone would exit the process)."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        text = config_text(smollm2_model, port, engine_kind="sim", http=http)
        daemon = lifecycle.Daemon(tmp_path / "lengthwise.toml", config_mod.decode(text))
        with caplog.at_level(logging.ERROR, "lengthwise"):
            assert asyncio.run(daemon.serve()) == 1
    assert daemon.service is None  # nothing was built
    assert f"cannot listen on 127.0.0.1:{port}" in caplog.text
