"""A daemon killed with SIGKILL takes its engines along: every process it started (the
forkserver, the EngineCore, its Worker) is gone within 10 s (daemon/executors/lifeline.py).
The forkserver is a fork of the daemon (enginefork.fork_now), not a fresh interpreter that
imports torch and vLLM a second time."""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.support import DaemonProcess, config_text, free_port

pytestmark = pytest.mark.engine

EXIT_WITHIN_S = 10.0


def _descendants(pid: int) -> tuple[list[psutil.Process], str]:
    """The live processes under `pid`, and their command lines."""
    found, names = [], []
    for process in psutil.Process(pid).children(recursive=True):
        try:
            names.append(" ".join(process.cmdline()))
        except psutil.Error:  # ended already (a zombie until its parent reaps it)
            continue
        found.append(process)
    return found, " | ".join(names)


def _running(process: psutil.Process) -> bool:
    """Not ended: an orphan that exited stays a zombie where PID 1 does not reap."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_engines_end_with_a_killed_daemon(tmp_path: Path, tiny_model: Path) -> None:
    config = tmp_path / "lengthwise.toml"
    config.write_text(config_text(tiny_model, free_port()))
    daemon = DaemonProcess(config, tmp_path / "daemon.log", warm=False)  # as users start it
    started: list[psutil.Process] = []
    try:
        daemon.wait_ready()
        answer = httpx.post(daemon.base_url + "/v1/completions", timeout=60,
                            json={"prompt": "hello", "max_tokens": 4})
        assert answer.status_code == 200, answer.text
        started, names = _descendants(daemon.proc.pid)
        assert "EngineCore" in names and "Worker" in names, names
        assert "multiprocessing.forkserver" not in names, names  # not spawned
        own = psutil.Process(daemon.proc.pid).cmdline()
        assert sum(p.cmdline() == own for p in started) == 1, names  # forked: the forkserver
        daemon.proc.send_signal(signal.SIGKILL)  # the daemon alone, not its group
        daemon.proc.wait(5)
        killed = time.monotonic()
        alive = started
        while alive and time.monotonic() - killed < EXIT_WITHIN_S:
            time.sleep(0.1)
            alive = [p for p in alive if _running(p)]
        assert not alive, [(p.pid, p.name()) for p in alive]
    finally:
        for leftover in started:  # whatever the outcome, leave nothing running
            with contextlib.suppress(psutil.Error):
                leftover.kill()
        daemon.stop()
