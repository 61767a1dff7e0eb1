"""server.max_connections on a real daemon over TCP (simulated engine): connections beyond
the cap get 503 with Retry-After and are closed, /health still answers, and the count comes
back down when streams end."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import DaemonProcess, config_text, free_port, sim_profile

MODEL = "smollm2-135m-instruct"
LONG = {"model": MODEL, "stream": True, "max_tokens": 2000, "ignore_eos": True,
        "messages": [{"role": "user", "content": "Count to a thousand."}]}
SHORT = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
CAP = 3


@pytest.fixture
def daemon(tmp_path: Path, smollm2_model: Path) -> Iterator[DaemonProcess]:
    # A slow simulated step (50 ms): the held streams would run 100 s, far longer than the
    # test (they are cut when released). At 10 ms (20 s) the first held stream could end
    # on a loaded machine before the last was admitted, and free its connection.
    text = config_text(smollm2_model, free_port(), engine_kind="sim", max_running=CAP + 1,
                       extra=sim_profile(tmp_path / "slow.json", decode_base_s=0.05))
    config = tmp_path / "lengthwise.toml"
    config.write_text(text.replace("[server]\n", f"[server]\nmax_connections = {CAP}\n", 1))
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    try:
        daemon.wait_ready(60)
        yield daemon
    finally:
        daemon.stop()


async def _hold_streams(url: str, count: int, release: asyncio.Event) -> None:
    """Open `count` streams, each on its own connection, and keep them until `release`."""
    started = [asyncio.Event() for _ in range(count)]
    async with (httpx.AsyncClient(base_url=url, timeout=30) as client,
                asyncio.TaskGroup() as group):
        for event in started:
            group.create_task(_one_stream(client, event, release))
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 30)


async def _one_stream(client: httpx.AsyncClient, started: asyncio.Event,
                      release: asyncio.Event) -> None:
    async with client.stream("POST", "/v1/chat/completions", json=LONG) as response:
        assert response.status_code == 200
        async for _ in response.aiter_bytes():
            started.set()
            break
        await release.wait()


@pytest.mark.asyncio
async def test_connections_beyond_the_cap_get_503_and_are_closed(daemon: DaemonProcess) -> None:
    release = asyncio.Event()
    holders = asyncio.create_task(_hold_streams(daemon.base_url, CAP, release))
    async with httpx.AsyncClient(base_url=daemon.base_url, timeout=30) as client:
        deadline = time.monotonic() + 30
        while daemon.metric("lengthwise_running_jobs") < CAP:  # all CAP streams admitted
            assert not holders.done(), holders
            assert time.monotonic() < deadline, "the held streams were never all running"
            await asyncio.sleep(0.05)
        refused = await client.post("/v1/chat/completions", json=SHORT)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "too_many_connections"
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.headers["connection"] == "close"
        assert (await client.get("/health")).status_code == 200  # probes are not counted
        release.set()
        await holders
        deadline = time.monotonic() + 20
        while (served := await client.post("/v1/chat/completions", json=SHORT)).status_code \
                != 200:
            assert time.monotonic() < deadline, served.text
            await asyncio.sleep(0.1)
