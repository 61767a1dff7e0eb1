"""Overload and bad input on the real daemon (simulated executor: the HTTP side is what is
under test), through `lengthwise chaos`'s probes: the listen backlog is the configured one,
bursts of 500 concurrent requests get answers (200, or 429 with Retry-After), never
connection errors or 5xx, and the malformed corpus gets only the expected 4xx."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from bench import chaos
from tests.support import SMOLLM2, DaemonProcess, config_text, free_port, listen_backlog

pytestmark = pytest.mark.engine

MODEL = "smollm2-135m-instruct"


async def _probe(base_url: str) -> tuple[dict[str, float], dict[str, float]]:
    limits = httpx.Limits(max_connections=600, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=limits) as client:
        return (await chaos.malformed(client, MODEL),
                await chaos.overload(client, base_url, MODEL, concurrency=500, cycles=2))


def test_bursts_and_bad_input_get_answers(tmp_path: Path) -> None:
    config = tmp_path / "lengthwise.toml"
    port = free_port()
    config.write_text(config_text(SMOLLM2, port, engine_kind="sim", max_waiting=100,
                                  extra='[predictor]\npath = "none"\n'))
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    try:
        daemon.wait_ready(120)
        assert listen_backlog(port) == 4096
        bad, burst = asyncio.run(_probe(daemon.base_url))
        assert bad["5xx"] == 0 and bad["status as expected"] == bad["requests"], bad
        assert burst["connection errors"] == 0 and burst["5xx"] == 0, burst
        assert burst["200"] + burst["429"] == burst["requests"], burst
        assert burst["200"] >= 200 and burst["429"] >= 1, burst
        assert burst["429 without Retry-After"] == 0, burst
    finally:
        assert daemon.stop() == 0, daemon.log()
