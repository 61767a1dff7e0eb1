"""VLLMExecutor on the real engine and the default model."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from daemon.config import Config, EngineConfig, ModelConfig
from daemon.core.job import Job, SamplingSpec, StopRequest
from daemon.executors.base import Outcome
from daemon.executors.vllm import VLLMExecutor
from daemon.tokenizer import Tokenizer

pytestmark = pytest.mark.engine


class Recorder:
    def __init__(self) -> None:
        self.stops: list[tuple[str, Outcome, str | None]] = []
        self.changed = asyncio.Event()

    def __call__(self, job: Job, outcome: Outcome, detail: str | None) -> None:
        self.stops.append((job.job_id, outcome, detail))
        self.changed.set()

    async def next_stop(self) -> tuple[str, Outcome, str | None]:
        count = len(self.stops)
        while len(self.stops) == count:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), 60)
        return self.stops[-1]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def engine(smollm2_model: Path) -> AsyncIterator[tuple[VLLMExecutor, Recorder, Tokenizer]]:
    # float32: bf16 prefill and decode kernels round differently, so a resumed job (its
    # generated tokens re-prefilled) can flip a near-tie in greedy argmax; see docs.
    config = Config(model=ModelConfig(path=str(smollm2_model), max_model_len=1024),
                    engine=EngineConfig(max_num_seqs=4, vllm_args={"dtype": "float32"}))
    executor = VLLMExecutor("cpu-0", "cpu", config)
    recorder = Recorder()
    executor.on_stop = recorder
    await executor.start()
    yield executor, recorder, Tokenizer(str(smollm2_model))
    await executor.shutdown()


def _job(tokenizer: Tokenizer, job_id: str, max_tokens: int = 64) -> Job:
    prompt = tokenizer.encode_chat([{"role": "user", "content": "Tell me about the Moon."}])
    return Job(job_id, prompt, SamplingSpec(max_tokens=max_tokens, temperature=0.0), 0.0)


async def _wait_tokens(job: Job, count: int) -> None:
    while job.num_generated_tokens < count:
        await asyncio.sleep(0.002)


@pytest.mark.asyncio(loop_scope="module")
async def test_preempt_and_resume_give_the_uninterrupted_tokens(
        engine: tuple[VLLMExecutor, Recorder, Tokenizer]) -> None:
    executor, recorder, tokenizer = engine
    whole = _job(tokenizer, "whole")
    executor.launch(whole, None, 0)
    assert await recorder.next_stop() == ("whole", Outcome.FINISHED, "length")

    cut = _job(tokenizer, "cut")
    for stop_at in (5, 23, 40):  # three preemptions at different depths
        executor.launch(cut, None, 0)
        await _wait_tokens(cut, stop_at)
        executor.request_stop(cut, StopRequest.PREEMPT)
        assert (await recorder.next_stop())[1] is Outcome.YIELDED
    executor.launch(cut, None, 0)
    assert await recorder.next_stop() == ("cut", Outcome.FINISHED, "length")
    assert cut.generated_token_ids == whole.generated_token_ids
    assert len(cut.generated_token_ids) == 64
    texts = [cut.outputs.get_nowait().text for _ in range(cut.outputs.qsize())]
    wholes = [whole.outputs.get_nowait().text for _ in range(whole.outputs.qsize())]
    assert "".join(texts) == "".join(wholes)  # detokenized across resumes too


@pytest.mark.asyncio(loop_scope="module")
async def test_token_budget_yields_then_completes(
        engine: tuple[VLLMExecutor, Recorder, Tokenizer]) -> None:
    executor, recorder, tokenizer = engine
    job = _job(tokenizer, "sliced", max_tokens=30)
    outcomes = []
    while True:
        executor.launch(job, 8, 0)
        outcomes.append((await recorder.next_stop())[1])
        if outcomes[-1] is not Outcome.YIELDED:
            break
    assert outcomes == [Outcome.YIELDED] * 3 + [Outcome.FINISHED]
    assert job.num_generated_tokens == 30


@pytest.mark.asyncio(loop_scope="module")
async def test_abort_stops_the_engine_request(
        engine: tuple[VLLMExecutor, Recorder, Tokenizer]) -> None:
    executor, recorder, tokenizer = engine
    job = _job(tokenizer, "aborted", max_tokens=500)
    executor.launch(job, None, 0)
    await _wait_tokens(job, 3)
    executor.request_stop(job, StopRequest.ABORT)
    assert await recorder.next_stop() == ("aborted", Outcome.ABORTED, "abort")
    assert job.num_generated_tokens < 500
    assert not executor.running
