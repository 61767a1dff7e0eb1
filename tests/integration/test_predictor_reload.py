"""Retraining from the daemon's own request log without a restart: the real daemon
(simulated executor: the predictor is under test, not the engine) logs its completions,
`lengthwise predictor train --data LOG` trains on them (torn last line included), and
SIGHUP swaps the model in; a broken model is refused and the running one kept."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from predictor import default_predictor_path
from tests.support import (
    LENGTHWISE,
    ROOT,
    SMOLLM2,
    DaemonProcess,
    config_text,
    free_port,
    sim_profile,
)

MODEL = "smollm2-135m-instruct"
PROBE = [{"role": "user", "content": "Describe the water cycle for a ten-year-old."}]
REQUESTS = 24


def _ask(base_url: str, messages: list[dict[str, str]], max_tokens: int) -> httpx.Response:
    response = httpx.post(base_url + "/v1/chat/completions", timeout=120, json={
        "model": MODEL, "messages": messages, "max_tokens": max_tokens})
    assert response.status_code == 200, response.text
    return response


def _predicted(base_url: str) -> float:
    """The probe's prediction. Its answer is long enough to outlast the prediction: an
    uncontended job starts before its prediction comes, and an answer that ends first has
    no prediction header (1 token on the sim's 1 ms steps did, once in the suite)."""
    return float(_ask(base_url, PROBE, 256).headers["x-lengthwise-predicted-tokens"])


def _wait(what: str, cond: Callable[[], bool], daemon: DaemonProcess, timeout_s: float = 60.0
          ) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not seen:\n{daemon.log()}")
        time.sleep(0.2)


def _replace_model(src: Path, dst: Path) -> None:
    for file in src.iterdir():
        shutil.copy2(file, dst / file.name)


def test_retrain_from_request_log_then_sighup_reloads(tmp_path: Path) -> None:
    live = tmp_path / "predictor"
    shutil.copytree(default_predictor_path(), live)
    log_path = tmp_path / "requests.jsonl"
    config = tmp_path / "lengthwise.toml"
    config.write_text(config_text(
        SMOLLM2, free_port(), engine_kind="sim", max_running=16, max_num_seqs=16,
        # A generous prediction deadline: what is tested is the model swapped in, not how
        # fast it answers on a busy test machine (past 0.5 s a request gets the fallback,
        # and no prediction header: seen once in the suite).
        extra=f'[predictor]\npath = "{live}"\niterative_path = "none"\ntimeout_s = 30\n'
              f'request_log = "{log_path}"\n'
              + sim_profile(tmp_path / "fast.json", decode_base_s=0.001)))
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    try:
        daemon.wait_ready(120)
        before = _predicted(daemon.base_url)
        # Completions that stop by themselves are logged in the predictor's record shape.
        asks = [[{"role": "user", "content": f"Question {i}: " + "tell me more " * (i % 7)}]
                for i in range(REQUESTS)]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda m: _ask(daemon.base_url, m, 1024), asks))
        _wait("the request log", lambda: log_path.exists() and
              len(log_path.read_bytes().splitlines()) >= REQUESTS, daemon)
        with open(log_path, "ab") as f:  # as if the daemon had died mid-write
            f.write(b'{"id":"chatcmpl-torn","messages":[{"role":"us')

        new = tmp_path / "retrained"
        trained = subprocess.run(
            [str(LENGTHWISE), "predictor", "train", "--kind", "proxy", "--data", str(log_path),
             "--out", str(new), "--epochs", "1", "--dev-limit", "0"],
            check=False, cwd=ROOT, capture_output=True, text=True, timeout=600,
            env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert trained.returncode == 0, trained.stderr
        assert "torn last line" in trained.stderr

        # A broken model (a torn weights file) is refused; the running one keeps serving.
        broken = tmp_path / "broken"
        shutil.copytree(new, broken)
        (broken / "net.pt").write_bytes((new / "net.pt").read_bytes()[:1000])
        _replace_model(broken, live)
        daemon.signal(signal.SIGHUP)
        _wait("the refusal", lambda: daemon.metric("lengthwise_predictor_reload_failures_total") == 1,
              daemon)
        assert "predictor reload refused" in daemon.log()
        assert daemon.metric("lengthwise_predictor_reloads_total") == 0
        assert _predicted(daemon.base_url) == before

        # The retrained model is swapped in on the next SIGHUP, without a restart.
        _replace_model(new, live)
        pid = daemon.proc.pid
        daemon.signal(signal.SIGHUP)
        _wait("the reload", lambda: daemon.metric("lengthwise_predictor_reloads_total") == 1, daemon)
        after = _predicted(daemon.base_url)
        assert after != before and 16 <= after <= 1024  # the sim's natural lengths: 16-512
        assert daemon.proc.pid == pid and daemon.proc.poll() is None

        # Unchanged files: SIGHUP reloads nothing.
        daemon.signal(signal.SIGHUP)
        _wait("the unchanged check", lambda: "unchanged; not reloaded" in daemon.log(), daemon)
        assert daemon.metric("lengthwise_predictor_reloads_total") == 1
        assert daemon.metric("lengthwise_predictor_reload_failures_total") == 1
        assert _predicted(daemon.base_url) == after
    finally:
        assert daemon.stop() == 0, daemon.log()
