"""Overload and refusals in-process (ASGI, simulated executor, ssjf so every request is
predicted first): 429 and 503 carry Retry-After, and a refused request leaves nothing behind
in the predictor."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from daemon.config import Config, EngineConfig, LimitsConfig, ModelConfig, SchedulerConfig
from daemon.core.job import SamplingSpec
from daemon.http.app import build_app
from daemon.service import Service

pytestmark = pytest.mark.asyncio

MODEL = "smollm2-135m-instruct"
ASK = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}


@pytest_asyncio.fixture
async def rig(smollm2_model: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Service]]:
    config = Config(model=ModelConfig(path=str(smollm2_model), max_model_len=512),
                    engine=EngineConfig(kind="sim", max_num_seqs=2),
                    scheduler=SchedulerConfig(policy="ssjf", max_running=2, max_waiting=2),
                    limits=LimitsConfig(drain_timeout_s=12.5))
    service = await Service.create(config)
    transport = httpx.ASGITransport(app=build_app(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        yield http, service
    await service.shutdown()


async def _fill(service: Service) -> None:
    """Both slots running and both waiting places taken, by jobs that last a while."""
    long = SamplingSpec(max_tokens=400, ignore_eos=True)
    for _ in range(4):
        service.submit(service.new_job([1, 2], long, 0, "fill"))
        await asyncio.sleep(0.01)


async def test_refusals_carry_retry_after_and_leak_no_prediction(
        rig: tuple[httpx.AsyncClient, Service]) -> None:
    http, service = rig
    starting = await http.post("/v1/chat/completions", json=ASK)
    assert starting.status_code == 503 and int(starting.headers["retry-after"]) >= 1
    await service.start()
    assert service.predictions.predictor is not None  # predicted before being queued
    await _fill(service)
    for _ in range(5):
        response = await http.post("/v1/chat/completions", json=ASK)
        assert response.status_code == 429, response.text
        assert response.json()["error"]["type"] == "rate_limit_error"
        assert 1 <= int(response.headers["retry-after"]) <= 300
    # Refused before the core ever saw them: only the 4 admitted jobs were predicted.
    assert service.predictions.num_tracked == 4
    await service.scheduler.abort_all(timeout_s=5)


async def test_draining_503_says_when_to_retry(rig: tuple[httpx.AsyncClient, Service]) -> None:
    http, service = rig
    await service.start()
    assert await service.scheduler.drain(1.0)
    response = await http.post("/v1/chat/completions", json=ASK)
    assert response.status_code == 503
    assert response.headers["retry-after"] == "13"  # the drain limit, rounded up
    assert response.json()["error"]["type"] == "server_error"


async def test_a_chunked_body_is_cut_at_the_limit(rig: tuple[httpx.AsyncClient, Service]
                                                  ) -> None:
    http, service = rig
    await service.start()
    sent = 0

    async def endless() -> AsyncIterator[bytes]:  # no content-length: sent chunked
        nonlocal sent
        yield b'{"model": "' + MODEL.encode() + b'", "user": "'
        while sent < 64 * 2**20:
            sent += 2**16
            yield b"x" * 2**16

    limit = service.config.server.max_body_bytes
    response = await http.post("/v1/chat/completions", content=endless())
    assert response.status_code == 413
    assert response.json()["error"]["message"] == f"request body exceeds {limit} bytes"
    assert sent < 2 * limit  # refused while it streamed in, not after 64 MiB
