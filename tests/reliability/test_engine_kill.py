"""Engine death on the real daemon: kill -9 the vLLM EngineCore mid-stream; the stream pauses
and finishes whole, /health says which executor is down and comes back, nothing is lost; and
an engine that cannot come back ends its jobs with an error and the daemon with exit 1."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest

from tests.support import DaemonProcess, config_text, free_port

pytestmark = pytest.mark.engine

_HEALTH = "[engine]\nhealth_check_interval_s = 0.2\n"


def _engine_core(daemon: DaemonProcess) -> psutil.Process:
    for child in psutil.Process(daemon.proc.pid).children(recursive=True):
        if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline()):
            return child
    raise AssertionError("no EngineCore among the daemon's children")


def _wait_health(daemon: DaemonProcess, status: int, timeout_s: float) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        response = httpx.get(daemon.base_url + "/health", timeout=5)
        if response.status_code == status:
            return response
        time.sleep(0.1)
    raise TimeoutError(f"/health never {status}:\n{daemon.log()}")


def _start(tmp_path: Path, model: Path, extra: str) -> DaemonProcess:
    config = tmp_path / "lengthwise.toml"
    # extra's [engine] keys go into the one [engine] table config_text writes.
    text = config_text(model, free_port()).replace("[engine]\n", extra, 1)
    config.write_text(text)
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    daemon.wait_ready()
    return daemon


def _kill_mid_stream(daemon: DaemonProcess, tokens: int, *, usage: bool,
                     before_kill: Callable[[], object] = lambda: None,
                     after_kill: Callable[[], object] = lambda: None) -> list[str]:
    """Stream a chat answer of `tokens` (with a last usage chunk if `usage`) and kill the
    engine after its first chunk, between `before_kill` and `after_kill`: the rest of the
    stream's lines."""
    body: dict[str, object] = {
        "model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}],
        "stream": True, "max_tokens": tokens, "ignore_eos": True}
    if usage:
        body["stream_options"] = {"include_usage": True}
    with httpx.stream("POST", daemon.base_url + "/v1/chat/completions", json=body,
                      timeout=180) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        before_kill()
        _engine_core(daemon).kill()
        after_kill()
        return [line for line in lines if line]


def test_engine_kill_resumes_and_an_engine_that_cannot_restart_ends_jobs_and_exits_1(
        tmp_path: Path, tiny_model: Path) -> None:
    """One daemon, two engine deaths. The first mid-stream: the stream pauses and finishes
    whole, a request sent while the engine is down waits and runs. Then the model folder
    vanishes with the engine: restarts fail, the waiting stream ends with an OpenAI error
    event, and the daemon exits 1 for systemd to restart it."""
    model = tmp_path / "tiny-llama"
    shutil.copytree(tiny_model, model)
    daemon = _start(tmp_path, model, _HEALTH.replace(
        "\n", "\nrestart_attempts = 2\nrestart_backoff_s = 0.2\n", 1))
    try:
        late: list[httpx.Response] = []
        sender = threading.Thread(target=lambda: late.append(httpx.post(
            daemon.base_url + "/v1/completions", timeout=180,
            json={"model": "tiny-llama", "prompt": "hello", "max_tokens": 8})))

        def send_while_down() -> None:
            down = _wait_health(daemon, 503, 15).json()
            assert down["status"] == "engine down" and "cpu-0" in down["executors_down"]
            sender.start()  # a request arriving while the engine is down waits, then runs

        rest = _kill_mid_stream(daemon, 400, usage=True, after_kill=send_while_down)
        sender.join(180)
        assert rest[-1] == "data: [DONE]"
        assert not any('"error"' in line for line in rest), rest[-5:]
        usage = json.loads(rest[-2].removeprefix("data: "))["usage"]
        assert usage["completion_tokens"] == 400  # the whole answer, across the restart
        assert late[0].status_code == 200, late[0].text
        assert late[0].json()["usage"]["completion_tokens"] == 8
        _wait_health(daemon, 200, 60)
        assert daemon.metric("lengthwise_engine_restarts_total") == 1

        # The restart's attempts count from the last token served: two more, both failing.
        rest = _kill_mid_stream(daemon, 1200, usage=False,
                                before_kill=lambda: shutil.rmtree(model))
        assert rest[-1] == "data: [DONE]"
        error = json.loads(rest[-2].removeprefix("data: "))["error"]
        assert "could not be restarted after 2 attempts" in error["message"]
        assert error["type"] == "server_error"
        assert daemon.proc.wait(60) == 1
        assert "restart attempt 2 failed" in daemon.log()
    finally:
        daemon.stop()
