"""The daemon's two predictors in-process: the shipped proxy makes the first estimate, the
shipped iterative model re-predicts running isrtf jobs (simulated executor, real models,
real HTTP client over ASGI); the fallbacks when it is off or late."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from bench import promtext
from daemon.config import (
    Config,
    EngineConfig,
    ModelConfig,
    PoliciesConfig,
    PredictorConfig,
    SchedulerConfig,
)
from daemon.core.job import Job, SamplingSpec
from daemon.http.app import build_app
from daemon.service import Service
from policies.isrtf import ISRTFParams

MODEL = "smollm2-135m-instruct"
ASK = [{"role": "user", "content": "Explain in detail how a hash table handles collisions."}]
TOKENS = 120  # windows at 50 and 100


class _Recording(Service):
    """The service, keeping every job that ended."""

    ended: list[Job]

    def _observe(self, job: Job) -> None:
        self.ended.append(job)
        super()._observe(job)


def _config(model: Path, predictor: PredictorConfig, timeout_s: float = 1.0) -> Config:
    return Config(model=ModelConfig(path=str(model), max_model_len=512),
                  engine=EngineConfig(kind="sim", max_num_seqs=2),
                  scheduler=SchedulerConfig(policy="isrtf", max_running=2),
                  policies=PoliciesConfig(isrtf=ISRTFParams(repredict_timeout_s=timeout_s)),
                  predictor=predictor)


@pytest_asyncio.fixture
async def served(smollm2_model: Path, request: pytest.FixtureRequest,
                 ) -> AsyncIterator[tuple[httpx.AsyncClient, Service, list[Job]]]:
    predictor, timeout_s = request.param
    service = await _Recording.create(_config(smollm2_model, predictor, timeout_s))
    service.ended = ended = []
    await service.start()
    transport = httpx.ASGITransport(app=build_app(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        yield http, service, ended
    await service.shutdown()


async def _ask(http: httpx.AsyncClient) -> str:
    response = await http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": ASK, "max_tokens": TOKENS, "ignore_eos": True})
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == TOKENS
    return response.headers["x-lengthwise-predicted-tokens"]  # the first estimate


def _metric(text: str, name: str) -> float:
    """The unlabelled sample `name`, which must be exported (a 0 that is absent proves nothing)."""
    assert f"\n{name} " in text, f"{name} is not exported"
    return promtext.total(text, name)


@pytest.mark.asyncio
@pytest.mark.parametrize("served", [(PredictorConfig(), 1.0)], indirect=True)
async def test_iterative_model_repredicts_a_running_isrtf_job(served) -> None:
    http, service, ended = served
    assert service.predictions.iterative.kind == "iterative"
    assert service.predictions.predictor.kind == "proxy"
    header = await _ask(http)
    text = (await http.get("/metrics")).text
    assert _metric(text, "lengthwise_repredictions_total") == 2  # at 50 and 100 tokens
    assert _metric(text, "lengthwise_repredict_failures_total") == 0
    assert "lengthwise_repredict_batch_seconds_count 2.0" in text
    # The last re-prediction (asked at 100 tokens) set the total, not the first guess.
    (job,) = ended
    assert job.first_prediction is not None and header == f"{job.first_prediction:.0f}"
    assert job.predicted_output_tokens != pytest.approx(job.first_prediction, abs=0.5)
    assert job.predicted_output_tokens >= 101


@pytest.mark.asyncio
@pytest.mark.parametrize("served", [(PredictorConfig(), 1.0)], indirect=True)
async def test_repredictions_read_the_decoded_partial_answer(served) -> None:
    _, service, _ = served
    from predictor import PredictInput

    answer = "Sure! Here is a step-by-step plan:\n1. First, " * 8
    ids = service.tokenizer.encode(answer)
    job = Job(job_id="x", prompt_token_ids=[1, 2, 3], sampling=SamplingSpec(max_tokens=400),
              arrival_time=0.0, generated_token_ids=ids, messages=ASK)
    await service.predictions.predict(job)
    (got,) = await service.predictions.remaining([job])
    (want,) = service.predictions.iterative.predict_remaining(
        [(PredictInput.from_openai(ASK), service.tokenizer.decode(ids))])
    assert got == pytest.approx(want)
    unknown = Job(job_id="y", prompt_token_ids=[1], sampling=SamplingSpec(max_tokens=400),
                  arrival_time=0.0, predicted_output_tokens=90.0)
    assert await service.predictions.remaining([unknown]) == [90.0]  # keeps its estimate


@pytest.mark.asyncio
@pytest.mark.parametrize("served", [(PredictorConfig(iterative_path="none"), 1.0),
                                    (PredictorConfig(), 1e-9)], indirect=True)
async def test_off_or_late_keeps_first_prediction_minus_tokens(served) -> None:
    http, service, ended = served
    header = await _ask(http)
    text = (await http.get("/metrics")).text
    assert _metric(text, "lengthwise_repredictions_total") == 0
    if service.predictions.iterative is None:  # off: nothing asked
        assert service.scheduler.repredictor.predict is None
        assert _metric(text, "lengthwise_repredict_batches_total") == 0
    else:  # every batch timed out: counted, the job kept its first estimate
        assert _metric(text, "lengthwise_repredict_failures_total") == 2
    (job,) = ended
    assert job.predicted_output_tokens == job.first_prediction
    assert header == f"{job.first_prediction:.0f}"
