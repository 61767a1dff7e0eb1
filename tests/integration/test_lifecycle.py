"""Signals and sd_notify on the real daemon: readiness, watchdog, reload, drain; a taken port
on both HTTP servers. (The drain on both servers, its limit and the servers' graceful
timeout: tests/http/test_servers.py, on a daemon those tests share.)"""

from __future__ import annotations

import asyncio
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
from tests.support import DaemonProcess, config_text, free_port

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


def _start(tmp_path: Path, model: Path, notify: NotifySocket) -> DaemonProcess:
    config = tmp_path / "lengthwise.toml"
    config.write_text(config_text(model, free_port()))
    env = {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "400000"}
    # Forked warm (tests/warmstart.py): the child is the process systemd would start, with
    # default signal handlers and this environment; the console script's cold start is
    # tests/reliability/test_daemon_kill.py's (~10 s of a worker less here).
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
                          json=_stream_body(200), timeout=120) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            daemon.signal(signal.SIGTERM)
            notify.read("STOPPING=1")
            refused = _try_request(daemon)
            rest = [line for line in lines if line]
        assert refused in (503, "connection refused")
        assert rest[-1] == "data: [DONE]"
        assert '"completion_tokens":200' in rest[-2]  # the running stream finished whole
        assert daemon.proc.wait(60) == 0
    finally:
        daemon.stop()


def _try_request(daemon: DaemonProcess) -> int | str:
    try:
        return httpx.post(daemon.base_url + "/v1/chat/completions", timeout=10,
                          json={"model": "tiny-llama", "max_tokens": 1,
                                "messages": [{"role": "user", "content": "hi"}]}).status_code
    except httpx.ConnectError:
        return "connection refused"


SERVERS = ["uvicorn", "hypercorn"]


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
