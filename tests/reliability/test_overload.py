"""Overload on the real daemon (simulated executor: the HTTP side is what is under test):
the listen backlog is the configured one, and a burst of 500 concurrent requests gets
answers (200 or 429 with Retry-After), not connection errors."""

from __future__ import annotations

import asyncio
import collections
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.support import SMOLLM2, DaemonProcess, config_text, free_port

pytestmark = pytest.mark.engine

CONCURRENCY = 500


def _listen_backlog(port: int) -> int:
    """Send-Q of a listening socket in `ss -ltn` is its backlog."""
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True,
                         check=True).stdout.split()
    return int(out[2])


async def _burst(base_url: str) -> collections.Counter[str]:
    body = {"model": "smollm2-135m-instruct", "max_tokens": 4, "ignore_eos": True,
            "messages": [{"role": "user", "content": "hi"}]}
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=0)
    outcomes: collections.Counter[str] = collections.Counter()
    async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=limits) as client:
        async def one() -> None:
            try:
                response = await client.post("/v1/chat/completions", json=body)
            except httpx.TransportError as exc:
                outcomes[type(exc).__name__] += 1
                return
            outcomes[str(response.status_code)] += 1
            if response.status_code == 429:
                outcomes["429 with retry-after"] += "retry-after" in response.headers

        await asyncio.gather(*(one() for _ in range(CONCURRENCY)))
    return outcomes


def test_burst_of_500_gets_answers(tmp_path: Path) -> None:
    config = tmp_path / "lengthwise.toml"
    port = free_port()
    text = config_text(SMOLLM2, port, engine_kind="sim", extra='[predictor]\npath = "none"\n')
    config.write_text(text.replace("[scheduler]\n", "[scheduler]\nmax_waiting = 100\n"))
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    try:
        daemon.wait_ready(120)
        assert _listen_backlog(port) == 4096
        outcomes = asyncio.run(_burst(daemon.base_url))
        assert sum(outcomes[k] for k in ("200", "429")) == CONCURRENCY, outcomes
        assert outcomes["200"] >= 100 and outcomes["429"] >= 1, outcomes
        assert outcomes["429 with retry-after"] == outcomes["429"], outcomes
    finally:
        assert daemon.stop() == 0, daemon.log()
