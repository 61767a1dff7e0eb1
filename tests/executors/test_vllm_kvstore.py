"""VLLMExecutor with [kvstore] on an engine that cannot load the connector: it logs once,
runs without it, and no request fails (real engine, tiny model)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from daemon.config import Config, EngineConfig, KVStoreConfig, ModelConfig
from daemon.core.job import Job, KVResidency, SamplingSpec, StopRequest
from daemon.executors.base import KVStoreTotals, Outcome
from daemon.executors.vllm import VLLMExecutor

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
    executor = BrokenConnector("cpu-0", "cpu", config)
    stops: asyncio.Queue[tuple[Job, Outcome]] = asyncio.Queue()
    executor.on_stop = lambda job, outcome, detail: stops.put_nowait((job, outcome))
    with caplog.at_level(logging.WARNING, logger="daemon.executors.vllm"):
        await executor.start()
    try:
        warnings = [r for r in caplog.records if "cannot run with kvstore" in r.message]
        assert len(warnings) == 1 and not executor.kvstore_active
        job = Job("j", list(range(100, 400)), SamplingSpec(max_tokens=40, temperature=0.0,
                                                           ignore_eos=True), 0.0)
        executor.launch(job, None, 0)
        while job.num_generated_tokens < 5:
            await asyncio.sleep(0.005)
        job.kv_residency = KVResidency.OFFLOAD  # the policy's word, with no store to act
        executor.request_stop(job, StopRequest.PREEMPT)
        assert (await asyncio.wait_for(stops.get(), 60))[1] is Outcome.YIELDED
        executor.launch(job, None, 0)
        assert (await asyncio.wait_for(stops.get(), 60))[1] is Outcome.FINISHED
        assert job.num_generated_tokens == 40
        # The engine's prefix cache (on by default) served the resume's whole blocks; what
        # lies past them was prefilled again.
        context = 300 + job.tokens_at_dispatch
        assert executor.resume_stats.resumes == 1
        assert 0 < executor.resume_stats.recomputed_tokens <= context - context // 128 * 128
        assert executor.kvstore_totals() == KVStoreTotals()
    finally:
        await executor.shutdown()


class CrashingKVStore(VLLMExecutor):
    """The connector's worker exits when it saves: the engine dies at each offload."""

    def _kv_transfer_config(self) -> Any:
        config = super()._kv_transfer_config()
        config.kv_connector = "CrashingConnector"
        config.kv_connector_module_path = "tests.kvstore.crashing"
        return config


async def _offload_and_resume(executor: VLLMExecutor, job: Job,
                              stops: asyncio.Queue[tuple[Job, Outcome]]) -> Outcome:
    """Run `job` 5 more tokens, preempt it with OFFLOAD, resume it; the resume's outcome
    (its save kills a crashing connector's engine: then the run is cut, YIELDED)."""
    executor.launch(job, None, 0)
    while job.num_generated_tokens < job.tokens_at_dispatch + 5:
        await asyncio.sleep(0.005)
    job.kv_residency = KVResidency.OFFLOAD
    executor.request_stop(job, StopRequest.PREEMPT)
    assert (await asyncio.wait_for(stops.get(), 60))[1] is Outcome.YIELDED
    executor.launch(job, None, 0)
    return (await asyncio.wait_for(stops.get(), 120))[1]


@pytest.mark.asyncio
async def test_an_engine_that_keeps_dying_with_kvstore_is_restarted_without_it(
        tiny_model: Path, caplog: pytest.LogCaptureFixture) -> None:
    """kvstore.max_engine_failures = 2: the first death restarts the engine with the
    connector, the second without it; the job survives both and finishes."""
    config = Config(model=ModelConfig(path=str(tiny_model), max_model_len=1024),
                    engine=EngineConfig(max_num_seqs=2, vllm_args={"dtype": "float32"}),
                    kvstore=KVStoreConfig(enabled=True, quantization="none",
                                          max_engine_failures=2))
    executor = CrashingKVStore("cpu-0", "cpu", config)
    stops: asyncio.Queue[tuple[Job, Outcome]] = asyncio.Queue()
    executor.on_stop = lambda job, outcome, detail: stops.put_nowait((job, outcome))
    await executor.start()
    try:
        job = Job("j", list(range(100, 400)), SamplingSpec(max_tokens=60, temperature=0.0,
                                                           ignore_eos=True), 0.0)
        with caplog.at_level(logging.WARNING, logger="daemon.executors.vllm"):
            for still_with_kvstore in (True, False):
                assert executor.kvstore_active
                assert await _offload_and_resume(executor, job, stops) is Outcome.YIELDED
                assert executor.down_reason is not None  # the engine died at the save
                await executor.restart_engine()
                executor.mark_up()
                assert executor.kvstore_active is still_with_kvstore
        warnings = [r for r in caplog.records if "failed 2 times with kvstore" in r.message]
        assert len(warnings) == 1
        assert await _offload_and_resume(executor, job, stops) is Outcome.FINISHED
        assert job.num_generated_tokens == 60
    finally:
        await executor.shutdown()
