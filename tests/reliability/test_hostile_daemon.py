"""The largest requests each limit allows, 8 at once, on the real daemon (uvicorn, httptools,
its event loop; the simulated engine: the HTTP side and the core are under test): every one
answered (200, a 429 while the queue is full, a 400 for what can never fit), /health
answering throughout, and the daemon's own lengthwise_event_loop_lag_seconds at most
50 ms (but for what a shared host's other tenants take: LATE_SHARE). Also what only the real server shows: httptools' own 400 in the OpenAI error shape,
and lengthwise_config_info."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest

from daemon.executors import requestlimits
from tests.support import SMOLLM2, DaemonProcess, config_text, free_port

pytestmark = pytest.mark.engine

MODEL = "smollm2-135m-instruct"
MAX_WAITING = 1024  # the daemon's default scheduler.max_waiting
MAX_BODY = 4 * 1024 * 1024  # its default server.max_body_bytes
LAG_S = 0.05
AT_ONCE = 8
# Probes later than LAG_S allowed: the loop's longest hold here is one large body's
# decoding (these bodies: about 10 ms of CPU each, taking turns); on a shared 2-core test
# host other tenants delay some probes too (measured there idle: 1 of 299, by ~1 s; under
# this test: 1-5 %, where before the limits one request froze the loop for good).
LATE_SHARE = 0.1
HEALTH_S = 2.0  # /health's answer, each


def _largest() -> dict[str, tuple[str, dict[str, object]]]:
    """One request at each limit (vLLM's, read from it, and lengthwise's)."""
    limits = requestlimits.read()
    hello = [{"role": "user", "content": "hello"}]
    words = [f"w{i}" for i in range(limits.vllm_max_num_bad_words)]
    return {
        "n = max_waiting": ("/v1/chat/completions",
                            {"messages": hello, "n": MAX_WAITING, "max_tokens": 1}),
        "n = max_waiting, streamed": ("/v1/chat/completions",
                                      {"messages": hello, "n": MAX_WAITING, "max_tokens": 2,
                                       "stream": True}),
        "n far beyond vLLM's limit": ("/v1/chat/completions",
                                      {"messages": hello, "n": 2**40, "max_tokens": 1}),
        "n beyond the queue": ("/v1/chat/completions",
                               {"messages": hello, "n": 5000, "max_tokens": 1}),
        "prompts = VLLM_MAX_COMPLETION_PROMPTS": (
            "/v1/completions", {"prompt": [f"p{i}" for i in range(min(
                limits.vllm_max_completion_prompts, MAX_WAITING))], "max_tokens": 1}),
        "prompts x n = max_waiting": ("/v1/completions",
                                      {"prompt": ["a", "b", "c", "d", "e", "f", "g", "h"],
                                       "n": MAX_WAITING // 8, "max_tokens": 1}),
        "stop, bad words, logprob ids at vLLM's limits": (
            "/v1/chat/completions",
            {"messages": hello, "max_tokens": 1, "stop": ["x"] * limits.vllm_max_stop_strings,
             "bad_words": words, "logprobs": True,
             "logprob_token_ids": list(range(limits.max_logprob_token_ids)),
             "logit_bias": {str(i): 1.0 for i in range(20_000)}}),
        "a body of max_body_bytes": ("/v1/completions",
                                     {"prompt": "word " * ((MAX_BODY - 100) // 5)}),
        "20k messages": ("/v1/chat/completions",
                         {"messages": hello * 20_000, "max_tokens": 1}),
    }


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    folder = tmp_path_factory.mktemp("hostile-daemon")
    config = folder / "lengthwise.toml"
    config.write_text(config_text(SMOLLM2, free_port(), engine_kind="sim",
                                  extra='[predictor]\npath = "none"\n'))
    process = DaemonProcess(config, folder / "daemon.log")
    try:
        process.wait_ready(120)
        # The event loop's thread first in line for a CPU, as on a host of its own: what is
        # measured is the loop's own work, not other tenants of a shared test host.
        with contextlib.suppress(psutil.Error):
            psutil.Process(process.proc.pid).nice(-10)
        yield process
    finally:
        assert process.stop() == 0, process.log()


def _lag(daemon: DaemonProcess) -> tuple[float, float]:
    """(probes so far, probes that fired at most LAG_S late)."""
    text = httpx.get(daemon.base_url + "/metrics", timeout=10).text
    total = within = 0.0
    for line in text.splitlines():
        if line.startswith("lengthwise_event_loop_lag_seconds_count "):
            total = float(line.split()[1])
        elif line.startswith(f'lengthwise_event_loop_lag_seconds_bucket{{le="{LAG_S}"}}'):
            within = float(line.split()[1])
    return total, within


async def _hammer(base_url: str) -> tuple[dict[str, list[int]], list[float]]:
    """Each largest request AT_ONCE times at once, one kind after another, while /health is
    asked every 100 ms; the statuses per kind and /health's answer times."""
    statuses: dict[str, list[int]] = {}
    health: list[float] = []
    # A new connection per request: a pooled one left idle past uvicorn's keep-alive (5 s,
    # as vLLM's server) can be closed by the server just as the next POST goes out on it
    # (HTTP/1.1's keep-alive race, seen here once as a ReadError after a 6.4 s kind): what
    # this test measures is the daemon's answers and its loop, not that race.
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=limits) as client:
        done = asyncio.Event()

        async def probe() -> None:
            while not done.is_set():
                started = time.perf_counter()
                assert (await client.get("/health")).status_code == 200
                health.append(time.perf_counter() - started)
                await asyncio.sleep(0.1)

        prober = asyncio.create_task(probe())
        for name, (path, fields) in _largest().items():
            body = json.dumps({"model": MODEL, **fields}).encode()
            started = time.perf_counter()
            answers = await asyncio.gather(*(client.post(
                path, content=body, headers={"content-type": "application/json"})
                for _ in range(AT_ONCE)))
            statuses[name] = [a.status_code for a in answers]
            # the figure issue 38 asks for (printed; pytest -s shows it)
            print(f"{name}: {AT_ONCE} at once -> {sorted(set(statuses[name]))}, all answered "
                  f"in {(time.perf_counter() - started) * 1e3:.0f} ms")
            for answer in answers:
                if answer.status_code >= 400:
                    assert answer.json()["error"]["message"], (name, answer.text[:200])
        done.set()
        await prober
    return statuses, health


def test_the_largest_requests_8_at_once_keep_the_loop_free(daemon: DaemonProcess) -> None:
    before = _lag(daemon)
    statuses, health = asyncio.run(_hammer(daemon.base_url))
    after = _lag(daemon)
    for name, got in statuses.items():
        assert all(s in (200, 400, 429) for s in got), (name, got)
    assert 200 in statuses["n = max_waiting"] and 200 in statuses["prompts x n = max_waiting"]
    assert set(statuses["n far beyond vLLM's limit"]) == {400}
    assert set(statuses["n beyond the queue"]) == {400}  # never 429: it can never fit
    assert set(statuses["a body of max_body_bytes"]) == {400}  # cannot fit the context
    probes, within = after[0] - before[0], after[1] - before[1]
    assert probes >= 20, (before, after)
    late = probes - within
    print(f"loop lag: {late:.0f} of {probes:.0f} probes over {LAG_S * 1e3:.0f} ms; /health "
          f"at most {max(health) * 1e3:.0f} ms")
    assert late <= LATE_SHARE * probes, f"{late:.0f} of {probes:.0f} lag probes > {LAG_S} s"
    assert len(health) >= 10 and max(health) < HEALTH_S, max(health)


def test_the_servers_own_400_and_the_live_config(daemon: DaemonProcess) -> None:
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: 1_0\r\n\r\n{}")
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), reply[:200]
    assert b"content-type: application/json" in head.lower()
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error" and "HTTP" in error["message"]
    metrics = httpx.get(daemon.base_url + "/metrics", timeout=10).text
    assert "lengthwise_config_info{" in metrics and 'policy="fcfs"' in metrics
