"""A request's size limits in-process (ASGI, simulated executor): vLLM's own, read from the
installed vLLM, refused in vLLM's words before any work; lengthwise's (a request's
sequences never exceed what the queue holds) a 400 naming the field, never a 429 that a
client would retry forever; at the limit, a request is served."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from daemon.config import Config, EngineConfig, ModelConfig, PredictorConfig, SchedulerConfig
from daemon.executors import requestlimits
from daemon.executors.requestlimits import RequestLimits
from daemon.service import Service
from tests.support import ROOT, in_process

MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")

MODEL = "smollm2-135m-instruct"
MAX_WAITING = 64
HELLO = [{"role": "user", "content": "hello"}]
QUICK_S = 0.5  # a refusal before any work (measured: a few ms; before the limits, seconds)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def rig(smollm2_model: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Service]]:
    config = Config(model=ModelConfig(path=str(smollm2_model), max_model_len=512),
                    engine=EngineConfig(kind="sim", max_num_seqs=8),
                    scheduler=SchedulerConfig(max_running=8, max_waiting=MAX_WAITING),
                    predictor=PredictorConfig(path="none"))
    async with in_process(config) as (client, service):
        yield client, service


async def _post(http: httpx.AsyncClient, path: str, **fields: object) -> httpx.Response:
    body = {"model": MODEL, "max_tokens": 1, **fields}
    if path.endswith("chat/completions"):
        body.setdefault("messages", HELLO)
    else:
        body.setdefault("prompt", "hello")
    started = time.perf_counter()
    response = await http.post(path, content=json.dumps(body).encode(),
                               headers={"content-type": "application/json"})
    response.extensions["seconds"] = time.perf_counter() - started
    return response


def _refused(response: httpx.Response, param: str, words: str) -> None:
    assert response.status_code == 400, response.text
    assert "retry-after" not in response.headers
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert words in error["message"], error
    assert response.extensions["seconds"] < QUICK_S, response.extensions["seconds"]


def test_limits_are_read_from_the_installed_vllm_and_its_environment() -> None:
    from importlib.util import find_spec

    assert find_spec("vllm") is not None
    limits = requestlimits.read()
    assert limits.vllm_max_stop_strings >= 1 and limits.vllm_max_n_sequences >= 1
    code = "from daemon.executors import requestlimits as r; import sys; " \
           "print(r.read().vllm_max_n_sequences, 'vllm' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT, env={**os.environ, "VLLM_MAX_N_SEQUENCES": "7"})
    assert run.stdout.split() == ["7", "False"]  # vLLM's variable, vLLM not imported


@MODULE_LOOP
@pytest.mark.parametrize("n", [2**40, 200_000, 16_385])
async def test_n_beyond_vllms_limit_is_vllms_400(rig: tuple[httpx.AsyncClient, Service],
                                                 n: int) -> None:
    http, service = rig
    response = await _post(http, "/v1/chat/completions", n=n)
    _refused(response, "n", f"n must be at most {service.request_limits.vllm_max_n_sequences}")
    assert service.scheduler.num_jobs == 0


@MODULE_LOOP
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_n_the_queue_cannot_hold_is_a_400_not_a_429(
        rig: tuple[httpx.AsyncClient, Service], path: str) -> None:
    http, service = rig
    response = await _post(http, path, n=5000)
    _refused(response, "n", f"({MAX_WAITING}, scheduler.max_waiting)")
    assert service.scheduler.num_jobs == 0


@MODULE_LOOP
async def test_prompts_times_n_beyond_the_queue_is_a_400(
        rig: tuple[httpx.AsyncClient, Service]) -> None:
    http, _ = rig
    _refused(await _post(http, "/v1/completions", prompt=["a"] * 9, n=8), "n",
             "72 sequences (9 prompts x n=8)")
    _refused(await _post(http, "/v1/completions", prompt=["a"] * (MAX_WAITING + 1)),
             "prompt", "scheduler.max_waiting")


@MODULE_LOOP
async def test_vllms_limits_on_prompts_stop_strings_and_bad_words(
        rig: tuple[httpx.AsyncClient, Service]) -> None:
    http, service = rig
    limits = service.request_limits
    many = limits.vllm_max_completion_prompts + 1
    _refused(await _post(http, "/v1/completions", prompt=["a"] * many), "prompt",
             f"prompt list length {many} exceeds the maximum allowed count")
    stops = limits.vllm_max_stop_strings + 1
    _refused(await _post(http, "/v1/chat/completions", stop=["x"] * stops), "stop",
             f"at most {limits.vllm_max_stop_strings} items after validation, not {stops}")
    words = limits.vllm_max_num_bad_words + 1
    _refused(await _post(http, "/v1/completions", bad_words=[f"w{i}" for i in range(words)]),
             "bad_words", f"Too many bad words: {words}.")
    ids = limits.max_logprob_token_ids + 1
    _refused(await _post(http, "/v1/completions", logprob_token_ids=list(range(ids))),
             "logprob_token_ids", f"Requested logprob_token_ids of length {ids}")


@MODULE_LOOP
async def test_the_limits_apply_as_the_service_holds_them(
        rig: tuple[httpx.AsyncClient, Service]) -> None:
    http, service = rig
    held = service.request_limits
    service.request_limits = RequestLimits(
        vllm_max_n_sequences=3, vllm_max_completion_prompts=2, vllm_max_stop_strings=1,
        vllm_max_num_bad_words=1, vllm_max_bad_words_total_tokens=8,
        max_logprob_token_ids=2)
    try:
        _refused(await _post(http, "/v1/completions", n=4), "n", "n must be at most 3")
        _refused(await _post(http, "/v1/completions", prompt=["a", "b", "c"]), "prompt",
                 "maximum allowed count of 2")
        assert (await _post(http, "/v1/completions", n=3, stop=["x"])).status_code == 200
    finally:
        service.request_limits = held


@MODULE_LOOP
async def test_requests_at_the_limits_are_served(rig: tuple[httpx.AsyncClient, Service]
                                                 ) -> None:
    http, service = rig
    limits = service.request_limits
    chat = await _post(http, "/v1/chat/completions", n=MAX_WAITING,
                       stop=["x"] * limits.vllm_max_stop_strings)
    assert chat.status_code == 200, chat.text
    assert [c["index"] for c in chat.json()["choices"]] == list(range(MAX_WAITING))
    batch = await _post(http, "/v1/completions", prompt=[f"p{i}" for i in range(8)], n=8)
    assert batch.status_code == 200, batch.text
    assert len(batch.json()["choices"]) == MAX_WAITING
    assert service.scheduler.num_jobs == 0
