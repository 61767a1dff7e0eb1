from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon import sdnotify


@pytest.fixture
def listener(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        yield sock


def test_sends_assignments_as_one_datagram(listener: socket.socket) -> None:
    assert sdnotify.notify("READY=1", "STATUS=serving")
    assert listener.recv(4096) == b"READY=1\nSTATUS=serving"


def test_reloading_carries_monotonic_usec(listener: socket.socket) -> None:
    sdnotify.reloading()
    lines = listener.recv(4096).decode().splitlines()
    assert lines[0] == "RELOADING=1"
    usec = int(lines[1].removeprefix("MONOTONIC_USEC="))
    assert abs(usec - time.monotonic_ns() // 1000) < 5_000_000


def test_a_full_queue_never_blocks_the_caller(listener: socket.socket) -> None:
    started = time.monotonic()
    sent = [sdnotify.notify("WATCHDOG=1") for _ in range(500)]  # nobody reads
    assert time.monotonic() - started < 2
    assert sent[0] and not all(sent)


def test_without_systemd_nothing_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sdnotify.notify("READY=1") is False


def test_watchdog_interval_is_half_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "3000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert sdnotify.watchdog_interval_s() == 1.5
    monkeypatch.setenv("WATCHDOG_PID", "1")  # meant for another process
    assert sdnotify.watchdog_interval_s() is None
