"""VLLMExecutor on the real engine and the tiny model, driven by its command queue."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from daemon.core.events import Stopped
from daemon.core.job import Job, SamplingSpec, StopRequest
from daemon.core.stream import OutputStream
from daemon.tokenizer import Tokenizer
from tests.executors.driver import Driver

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def engine(tiny_engine: Driver, tiny_model: Path) -> tuple[Driver, Tokenizer]:
    return tiny_engine, Tokenizer(str(tiny_model))  # shared with test_resume_semantics


def _job(tokenizer: Tokenizer, job_id: str, max_tokens: int = 40) -> Job:
    prompt = tokenizer.encode_chat([{"role": "user", "content": "Tell me about the Moon."}])
    return Job(job_id, prompt, SamplingSpec(max_tokens=max_tokens, temperature=0.0), 0.0)


@pytest.mark.asyncio(loop_scope="session")
async def test_preempt_and_resume_give_the_uninterrupted_tokens(
        engine: tuple[Driver, Tokenizer]) -> None:
    driver, tokenizer = engine
    whole = _job(tokenizer, "whole")
    assert await driver.run(whole) == Stopped("cpu-0", "whole", "length")

    cut = _job(tokenizer, "cut")
    contexts = []  # prompt + output at each resume
    for stop_at in (4, 15, 28):  # three preemptions at different depths
        if cut.num_generated_tokens:
            contexts.append(len(cut.prompt_token_ids) + cut.num_generated_tokens)
        driver.launch(cut)
        await driver.wait_tokens(cut, stop_at)
        driver.stop(cut, StopRequest.PREEMPT)
        assert (await driver.next_stop()).finish_reason is None  # cut early, not ended
    contexts.append(len(cut.prompt_token_ids) + cut.num_generated_tokens)
    assert await driver.run(cut) == Stopped("cpu-0", "cut", "length")
    assert cut.generated_token_ids == whole.generated_token_ids
    assert len(cut.generated_token_ids) == 40
    assert await driver.text(cut) == await driver.text(whole)  # detokenized across resumes
    # Every resume reported its context (shorter than one 128-token block here: the
    # prefix cache holds only whole blocks, so all of it was prefilled again).
    resumes = driver.resumes(cut)
    assert [context for context, _ in resumes] == contexts
    assert all(0 < recomputed <= context for context, recomputed in resumes)


@pytest.mark.asyncio(loop_scope="session")
async def test_token_budget_yields_then_completes(engine: tuple[Driver, Tokenizer]) -> None:
    driver, tokenizer = engine
    job = _job(tokenizer, "sliced", max_tokens=30)
    reasons = []
    while job.num_remaining_budget_tokens > 0:
        reasons.append((await driver.run(job, budget=8)).finish_reason)
    assert reasons == ["length"] * 4  # three slices of 8, then the last 6 end the job
    assert job.num_generated_tokens == 30 and job.num_dispatches == 4


@pytest.mark.asyncio(loop_scope="session")
async def test_abort_stops_the_engine_request(engine: tuple[Driver, Tokenizer]) -> None:
    driver, tokenizer = engine
    job = _job(tokenizer, "aborted", max_tokens=500)
    driver.launch(job)
    await driver.wait_tokens(job, 3)
    driver.stop(job, StopRequest.ABORT)
    assert await driver.next_stop() == Stopped("cpu-0", "aborted", None)
    assert job.num_generated_tokens < 500
    assert not driver.executor._requests  # the engine request is gone with the run
    await asyncio.sleep(0.1)  # the abort reaches the engine
    assert not driver.executor._engine.output_processor.has_unfinished_requests()


class _BrokenStream(OutputStream):
    """A job's stream that fails on its third push (a bug in the job's own processing)."""

    def push(self, text: str, token_ids: list[int], logprobs: object = None) -> bool:
        if self.num_tokens >= 2:
            raise RuntimeError("broken stream")
        return super().push(text, token_ids)


@pytest.mark.asyncio(loop_scope="session")
async def test_a_failure_in_one_jobs_output_ends_that_job_only(
        engine: tuple[Driver, Tokenizer]) -> None:
    # Outputs are handled inside vLLM's output task, which every request depends on: an
    # error there must end the one job, not the task (nor restart the engine).
    driver, tokenizer = engine
    broken, fine = _job(tokenizer, "broken", max_tokens=16), _job(tokenizer, "fine", 16)
    driver.streams["broken"] = _BrokenStream()
    driver.launch(broken)
    driver.launch(fine)
    stops = {s.job_id: s for s in [await driver.next_stop(), await driver.next_stop()]}
    assert stops["broken"].finish_reason is None
    assert stops["broken"].error == "internal error: broken stream"
    assert stops["fine"] == Stopped("cpu-0", "fine", "length")
    assert fine.num_generated_tokens == 16
    assert driver.executor.engine_problem() is None  # still serving, never restarted
    assert await driver.run(_job(tokenizer, "after", 8)) == Stopped("cpu-0", "after", "length")
