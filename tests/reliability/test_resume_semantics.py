"""Preempt + resume on the real engine keeps sampling semantics: greedy output with presence
and frequency penalties equals an uninterrupted run's (the penalties count the tokens
generated before the cut), and a stop string that straddles the cut still stops the job at
the same place with the same text."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from daemon.config import Config, EngineConfig, ModelConfig
from daemon.core.job import Job, SamplingSpec, StopRequest, TokenDelta
from daemon.executors.base import Outcome
from daemon.executors.vllm import VLLMExecutor
from daemon.tokenizer import Tokenizer
from tests.executors.test_vllm import Recorder, _wait_tokens

pytestmark = pytest.mark.engine

Engine = tuple[VLLMExecutor, Recorder, list[int]]
PENALTIES = {"presence_penalty": 0.8, "frequency_penalty": 0.6}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def engine(smollm2_model: Path) -> AsyncIterator[Engine]:
    # float32: a resumed job's tokens are re-prefilled; bf16 could flip greedy near-ties.
    config = Config(model=ModelConfig(path=str(smollm2_model), max_model_len=1024),
                    engine=EngineConfig(max_num_seqs=4, vllm_args={"dtype": "float32"}))
    executor = VLLMExecutor("cpu-0", "cpu", config)
    executor.on_stop = recorder = Recorder()
    await executor.start()
    prompt = Tokenizer(str(smollm2_model)).encode_chat(
        [{"role": "user", "content": "List ten fruits and say one thing about each."}])
    yield executor, recorder, prompt
    await executor.shutdown()


def _job(prompt: list[int], job_id: str, max_tokens: int, **sampling: object) -> Job:
    spec = SamplingSpec(max_tokens=max_tokens, temperature=0.0, **sampling)  # type: ignore[arg-type]
    return Job(job_id, prompt, spec, 0.0)


def _text(job: Job) -> str:
    items = [job.outputs.get_nowait() for _ in range(job.outputs.qsize())]
    return "".join(item.text for item in items if isinstance(item, TokenDelta))


async def _run(executor: VLLMExecutor, recorder: Recorder, job: Job,
               budget: int | None = None) -> tuple[Outcome, str | None]:
    executor.launch(job, budget, 0)
    _, outcome, detail = await recorder.next_stop()
    return outcome, detail


@pytest.mark.asyncio(loop_scope="module")
async def test_penalties_count_the_tokens_before_a_preemption(engine: Engine) -> None:
    executor, recorder, prompt = engine
    plain = _job(prompt, "plain", 80)
    whole = _job(prompt, "whole", 80, **PENALTIES)
    assert await _run(executor, recorder, plain) == (Outcome.FINISHED, "length")
    assert await _run(executor, recorder, whole) == (Outcome.FINISHED, "length")
    # The penalties change this answer, so a resume that forgot them would show.
    assert whole.generated_token_ids != plain.generated_token_ids

    cut = _job(prompt, "cut", 80, **PENALTIES)
    for stop_at in (6, 25, 50):  # three preemptions at different depths
        executor.launch(cut, None, 0)
        await _wait_tokens(cut, stop_at)
        executor.request_stop(cut, StopRequest.PREEMPT)
        assert (await recorder.next_stop())[1] is Outcome.YIELDED
    assert cut.num_generated_tokens < 80
    assert await _run(executor, recorder, cut) == (Outcome.FINISHED, "length")
    assert cut.generated_token_ids == whole.generated_token_ids
    assert _text(cut) == _text(whole)


def _straddling_stop(full: str, head: str) -> str:
    """A stop string of 3 characters before the cut and 3 after, found nowhere earlier."""
    assert full.startswith(head) and len(full) > len(head) + 3
    stop = full[len(head) - 3:len(head) + 3]
    assert full.find(stop) == len(head) - 3, (full, head)
    return stop


@pytest.mark.asyncio(loop_scope="module")
async def test_stop_string_across_the_cut_is_found(engine: Engine) -> None:
    executor, recorder, prompt = engine
    reference, head = _job(prompt, "reference", 60), _job(prompt, "head", 24)
    await _run(executor, recorder, reference)
    await _run(executor, recorder, head)
    full, head_text = _text(reference), _text(head)
    stop = _straddling_stop(full, head_text)

    whole = _job(prompt, "whole-stop", 60, stop=(stop,))
    assert await _run(executor, recorder, whole) == (Outcome.FINISHED, "stop")
    assert _text(whole) == full[:len(head_text) - 3]

    cut = _job(prompt, "cut-stop", 60, stop=(stop,))
    assert await _run(executor, recorder, cut, budget=24) == (Outcome.YIELDED, None)
    assert cut.num_generated_tokens == 24
    assert await _run(executor, recorder, cut) == (Outcome.FINISHED, "stop")
    assert _text(cut) == full[:len(head_text) - 3]
    assert cut.generated_token_ids == whole.generated_token_ids
