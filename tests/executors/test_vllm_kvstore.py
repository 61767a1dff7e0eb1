"""VLLMExecutor with [kvstore] on an engine that cannot load the connector: it logs once,
runs without it, and no request fails (real engine, tiny model)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from daemon.config import Config, EngineConfig, KVStoreConfig, ModelConfig
from daemon.core.events import Event
from daemon.core.job import Job, SamplingSpec, StopRequest
from daemon.executors.base import KVStoreTotals
from daemon.executors.vllm import VLLMExecutor
from tests.executors.driver import Driver

pytestmark = pytest.mark.engine


class BrokenConnector(VLLMExecutor):
    """The connector's module cannot be imported inside the engine."""

    def _kv_transfer_config(self) -> Any:
        config = super()._kv_transfer_config()
        config.kv_connector_module_path = "kvstore.no_such_module"
        return config


@pytest.mark.asyncio
async def test_an_engine_that_cannot_load_kvstore_serves_without_it(
        tiny_model: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = Config(model=ModelConfig(path=str(tiny_model), max_model_len=1024),
                    engine=EngineConfig(max_num_seqs=2, vllm_args={"dtype": "float32"}),
                    kvstore=KVStoreConfig(enabled=True, quantization="none"))
    inbox: asyncio.Queue[Event] = asyncio.Queue()
    executor = BrokenConnector("cpu-0", "cpu", config, inbox)
    with caplog.at_level(logging.WARNING, logger="daemon.executors.vllm"):
        await executor.start()
    driver = Driver(executor, inbox)
    driver.start()
    try:
        warnings = [r for r in caplog.records if "cannot run with kvstore" in r.message]
        assert len(warnings) == 1 and not executor.kvstore_active
        job = Job("j", list(range(100, 400)), SamplingSpec(max_tokens=40, temperature=0.0,
                                                           ignore_eos=True), 0.0)
        driver.launch(job)
        await driver.wait_tokens(job, 5)
        driver.stop(job, StopRequest.PREEMPT, offload=True)  # with no store to act
        stopped = await driver.next_stop()
        assert stopped.finish_reason is None and not stopped.kv_offloaded
        assert (await driver.run(job)).finish_reason == "length"
        assert job.num_generated_tokens == 40
        # The engine's prefix cache (on by default) served the resume's whole blocks; what
        # lies past them was prefilled again.
        context = 300 + job.tokens_at_dispatch
        ((resumed_context, recomputed),) = driver.resumes(job)
        assert resumed_context == context
        assert 0 < recomputed <= context - context // 128 * 128
        assert executor.kvstore_totals() == KVStoreTotals()
    finally:
        await driver.close()
        await executor.shutdown()


class CrashingKVStore(VLLMExecutor):
    """The connector's worker exits when it saves: the engine dies at each offload."""

    def _kv_transfer_config(self) -> Any:
        config = super()._kv_transfer_config()
        config.kv_connector = "CrashingConnector"
        config.kv_connector_module_path = "tests.kvstore.crashing"
        return config


async def _offload_and_resume(driver: Driver, job: Job) -> str | None:
    """Run `job` 5 more tokens, preempt it with OFFLOAD, resume it; the resume's finish
    reason (its save kills a crashing connector's engine: then the run is cut, None)."""
    driver.launch(job)
    await driver.wait_tokens(job, job.tokens_at_dispatch + 5)
    driver.stop(job, StopRequest.PREEMPT, offload=True)
    assert (await driver.next_stop()).finish_reason is None
    driver.launch(job)
    return (await driver.next_stop(120)).finish_reason


@pytest.mark.asyncio
async def test_an_engine_that_keeps_dying_with_kvstore_is_restarted_without_it(
        tiny_model: Path, caplog: pytest.LogCaptureFixture) -> None:
    """kvstore.max_engine_failures = 2: the first death restarts the engine with the
    connector, the second without it; the job survives both and finishes."""
    config = Config(model=ModelConfig(path=str(tiny_model), max_model_len=1024),
                    engine=EngineConfig(max_num_seqs=2, vllm_args={"dtype": "float32"}),
                    kvstore=KVStoreConfig(enabled=True, quantization="none",
                                          max_engine_failures=2))
    inbox: asyncio.Queue[Event] = asyncio.Queue()
    executor = CrashingKVStore("cpu-0", "cpu", config, inbox)
    await executor.start()
    driver = Driver(executor, inbox)
    driver.start()  # the executor's task restarts its engine when it dies
    try:
        job = Job("j", list(range(100, 400)), SamplingSpec(max_tokens=60, temperature=0.0,
                                                           ignore_eos=True), 0.0)
        with caplog.at_level(logging.WARNING, logger="daemon.executors.vllm"):
            for still_with_kvstore in (True, False):
                assert executor.kvstore_active
                assert await _offload_and_resume(driver, job) is None  # cut: engine died
                async with asyncio.timeout(120):  # restarted by the executor's own task
                    while executor.down_reason is not None or executor.restarts < (
                            1 if still_with_kvstore else 2):
                        await asyncio.sleep(0.05)
                assert executor.kvstore_active is still_with_kvstore
        warnings = [r for r in caplog.records if "failed 2 times with kvstore" in r.message]
        assert len(warnings) == 1
        assert await _offload_and_resume(driver, job) == "length"
        assert job.num_generated_tokens == 60
    finally:
        await driver.close()
        await executor.shutdown()
