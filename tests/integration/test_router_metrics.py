"""An EPP-style scrape of a loaded daemon on the real vLLM engine (tiny model): every
metric the router reads is there, with vLLM's names and labels, and tracks the load."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
import openai
import pytest

from bench import promtext
from tests.http.test_routermetrics import ROUTER_GAUGES, first
from tests.support import DaemonProcess

pytestmark = pytest.mark.engine


async def _load(daemon: DaemonProcess, num: int) -> None:
    client = openai.AsyncOpenAI(base_url=daemon.base_url + "/v1", api_key="unused")
    async with client:
        await asyncio.gather(*(client.completions.create(
            model="tiny-llama", prompt=f"request {i}: " + "word " * 100, max_tokens=120,
            temperature=0.0, extra_body={"ignore_eos": True}) for i in range(num)))


def _scrape(daemon: DaemonProcess) -> dict[str, list]:  # type: ignore[type-arg]
    return promtext.families(httpx.get(daemon.base_url + "/metrics", timeout=5).text)


async def _scrape_under_load(daemon: DaemonProcess) -> dict[str, list]:  # type: ignore[type-arg]
    """The first scrape that shows both admitted jobs running inside the engine."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        families = await asyncio.to_thread(_scrape, daemon)
        if first(families, "vllm:num_requests_running").value == 2:
            return families
        await asyncio.sleep(0.05)
    raise TimeoutError("the engine never reported two running requests")


@pytest.mark.asyncio
async def test_epp_scrape_tracks_a_loaded_engine(
        policy_daemon: Callable[[str], DaemonProcess]) -> None:
    daemon = policy_daemon("fcfs")  # max_running=2: the other four wait in lengthwise
    load = asyncio.create_task(_load(daemon, 6))
    busy = await _scrape_under_load(daemon)
    await load
    idle = await asyncio.to_thread(_scrape, daemon)
    for name in ROUTER_GAUGES:
        assert first(busy, name).labels["model_name"] == "tiny-llama", name
    assert first(busy, "vllm:num_requests_waiting").value > 0
    assert first(busy, "lengthwise_running_jobs").value == 2  # admitted = running
    assert 0 < first(busy, "vllm:kv_cache_usage_perc").value <= 1
    info = first(busy, "vllm:cache_config_info")
    assert int(info.labels["block_size"]) > 0 and int(info.labels["num_gpu_blocks"]) > 0
    assert first(busy, "lengthwise_predicted_outstanding_tokens", executor="total").value > 0
    assert first(busy, "lengthwise_estimated_wait_seconds").value > 0
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running",
                 "vllm:kv_cache_usage_perc", "lengthwise_estimated_wait_seconds"):
        assert first(idle, name).value == 0, name
