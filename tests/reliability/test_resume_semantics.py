"""Preempt + resume on the real engine keeps sampling semantics: greedy output with presence
and frequency penalties equals an uninterrupted run's (the penalties count the tokens
generated before the cut), a stop string that straddles the cut still stops the job at
the same place with the same text, and logprobs neither get lost nor repeat across cuts."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.core.job import Job, SamplingSpec, StopRequest
from daemon.tokenizer import Tokenizer
from tests.executors.driver import Driver
from tests.support import read_to_end

pytestmark = pytest.mark.engine

Engine = tuple[Driver, list[int]]
PENALTIES = {"presence_penalty": 0.8, "frequency_penalty": 0.6}


@pytest.fixture(scope="module")
def engine(tiny_engine: Driver, tiny_model: Path) -> Engine:
    """The engine shared with tests/executors/test_vllm.py (job ids here start "rs-")."""
    prompt = Tokenizer(str(tiny_model)).encode_chat(
        [{"role": "user", "content": "List ten fruits and say one thing about each."}])
    return tiny_engine, prompt


def _job(prompt: list[int], job_id: str, max_tokens: int, **sampling: object) -> Job:
    spec = SamplingSpec(max_tokens=max_tokens, temperature=0.0, **sampling)  # type: ignore[arg-type]
    return Job(f"rs-{job_id}", prompt, spec, 0.0)


@pytest.mark.asyncio(loop_scope="session")
async def test_penalties_count_the_tokens_before_a_preemption(engine: Engine) -> None:
    driver, prompt = engine
    plain = _job(prompt, "plain", 48)
    whole = _job(prompt, "whole", 48, **PENALTIES)
    assert (await driver.run(plain)).finish_reason == "length"
    assert (await driver.run(whole)).finish_reason == "length"
    # The penalties change this answer, so a resume that forgot them would show.
    assert whole.generated_token_ids != plain.generated_token_ids

    cut = _job(prompt, "cut", 48, **PENALTIES)
    for stop_at in (5, 18, 32):  # three preemptions at different depths
        driver.launch(cut)
        await driver.wait_tokens(cut, stop_at)
        driver.stop(cut, StopRequest.PREEMPT)
        assert (await driver.next_stop()).finish_reason is None  # cut early
    assert cut.num_generated_tokens < 48
    assert (await driver.run(cut)).finish_reason == "length"
    assert cut.generated_token_ids == whole.generated_token_ids
    assert await driver.text(cut) == await driver.text(whole)


def _straddling_stop(full: str, head: str) -> str:
    """A stop string of 3 characters before the cut and 3 after, found nowhere earlier."""
    assert full.startswith(head) and len(full) > len(head) + 3
    stop = full[len(head) - 3:len(head) + 3]
    assert full.find(stop) == len(head) - 3, (full, head)
    return stop


@pytest.mark.asyncio(loop_scope="session")
async def test_stop_string_across_the_cut_is_found(engine: Engine) -> None:
    driver, prompt = engine
    # The penalties keep the tiny model's greedy text from repeating one token.
    reference = _job(prompt, "reference", 40, **PENALTIES)
    head = _job(prompt, "head", 16, **PENALTIES)
    await driver.run(reference)
    await driver.run(head)
    full, head_text = await driver.text(reference), await driver.text(head)
    stop = _straddling_stop(full, head_text)

    whole = _job(prompt, "whole-stop", 40, stop=(stop,), **PENALTIES)
    assert (await driver.run(whole)).finish_reason == "stop"
    assert await driver.text(whole) == full[:len(head_text) - 3]

    cut = _job(prompt, "cut-stop", 40, stop=(stop,), **PENALTIES)
    # A slice of 16 tokens: the engine ends it ("length") with budget left, so it goes on.
    assert (await driver.run(cut, budget=16)).finish_reason == "length"
    assert cut.num_generated_tokens == 16
    assert (await driver.run(cut)).finish_reason == "stop"
    assert await driver.text(cut) == full[:len(head_text) - 3]
    assert cut.generated_token_ids == whole.generated_token_ids


async def _read(driver: Driver, job: Job) -> tuple[list[int], list[list[tuple[int, float]]]]:
    """Token ids and logprob positions ((id, logprob) per candidate) as the client gets them."""
    deltas, _ = await read_to_end(driver.streams[job.job_id], 5)
    ids = [t for d in deltas for t in d.token_ids]
    positions = [[(c.token_id, c.logprob) for c in p] for d in deltas for p in d.logprobs or []]
    return ids, positions


@pytest.mark.asyncio(loop_scope="session")
async def test_logprobs_survive_preemptions_without_loss_or_repeat(engine: Engine) -> None:
    """Greedy with top-2 logprobs, repetition penalty, top_k, min_p and a stop token id:
    three preemptions give the same tokens and the same logprobs (1e-3) as no preemption,
    one position per token; prompt logprobs come once, from the first dispatch."""
    driver, prompt = engine
    extra = {"logprobs": 2, "prompt_logprobs": 1, "repetition_penalty": 1.3, "top_k": 5,
             "min_p": 0.01, "stop_token_ids": (13,)}
    whole = _job(prompt, "lp-whole", 40, **extra)
    await driver.run(whole)
    cut = _job(prompt, "lp-cut", 40, **extra)
    for stop_at in (3, 12, 24):
        driver.launch(cut)
        await driver.wait_tokens(cut, stop_at)
        driver.stop(cut, StopRequest.PREEMPT)
        stopped = await driver.next_stop()
        if stopped.finish_reason is not None:
            break
    else:
        await driver.run(cut)
    assert cut.generated_token_ids == whole.generated_token_ids
    whole_ids, whole_lp = await _read(driver, whole)
    cut_ids, cut_lp = await _read(driver, cut)
    assert cut_ids == whole_ids == whole.generated_token_ids
    assert len(cut_lp) == len(cut_ids) == len(whole_lp)
    for a, b in zip(cut_lp, whole_lp, strict=True):
        assert [t for t, _ in a] == [t for t, _ in b]
        assert all(abs(x - y) <= 1e-3 for (_, x), (_, y) in zip(a, b, strict=True))
    for job in (whole, cut):
        prompt_lp = driver.streams[job.job_id].prompt_logprobs
        assert prompt_lp is not None and len(prompt_lp) == len(prompt) and prompt_lp[0] is None
