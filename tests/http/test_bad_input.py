"""Malformed and unsupported requests in-process (ASGI, simulated executor): every one is a
4xx in the OpenAI error shape naming the field, decided before a job exists; fields that
change nothing are accepted."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from bench.malformed import Case, corpus
from daemon.service import Service
from tests.support import in_process, sim_config

# One daemon for the module (each request is refused or served on its own).
pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL = "smollm2-135m-instruct"
HELLO = [{"role": "user", "content": "hello"}]
CASES = corpus(MODEL)


def _chat(**fields: object) -> bytes:
    return json.dumps({"model": MODEL, "messages": HELLO, "max_tokens": 2, **fields}).encode()


HARMLESS = [
    {"user": "u1", "metadata": {"k": "v"}, "store": False, "service_tier": "auto"},
    {"logprobs": False, "top_logprobs": None, "tool_choice": "none",
     "parallel_tool_calls": False, "response_format": {"type": "text"}, "logit_bias": {},
     "best_of": 1, "use_beam_search": False, "session_id": "s", "mm_payload": "none"},
]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def served(smollm2_model: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Service]]:
    async with in_process(sim_config(smollm2_model, 512)) as both:
        yield both


@pytest_asyncio.fixture(loop_scope="module")
async def http(served: tuple[httpx.AsyncClient, Service]) -> AsyncIterator[httpx.AsyncClient]:
    client, service = served
    yield client
    assert service.scheduler.num_jobs == 0  # no refused request left a job behind


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
async def test_bad_input_is_a_4xx_naming_the_field(http: httpx.AsyncClient, case: Case) -> None:
    response = await http.post(case.path, content=case.body,
                               headers={"content-type": "application/json"})
    assert response.status_code == case.status, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    if case.param is not None:
        assert error["param"] == case.param, error


@pytest.mark.parametrize("fields", HARMLESS)
async def test_harmless_fields_are_accepted(http: httpx.AsyncClient,
                                            fields: dict[str, object]) -> None:
    response = await http.post("/v1/chat/completions", content=_chat(**fields),
                               headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] >= 1
