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

from daemon.config import Config, EngineConfig, ModelConfig, SchedulerConfig
from daemon.http.app import build_app
from daemon.service import Service

pytestmark = pytest.mark.asyncio

MODEL = "smollm2-135m-instruct"
CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
HELLO = [{"role": "user", "content": "hello"}]


def _chat(**fields: object) -> bytes:
    return json.dumps({"model": MODEL, "messages": HELLO, "max_tokens": 2, **fields}).encode()


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


# (name, path, raw body, expected status, expected param or None)
CORPUS: list[tuple[str, str, bytes, int, str | None]] = [
    ("deep JSON in a typed field", CHAT, _chat()[:-1] + b', "user": ' + _deep(1000).encode()
     + b"}", 400, "user"),
    ("deep JSON in the prompt", CMPL, b'{"model": "%s", "prompt": %s}' % (
        MODEL.encode(), _deep(5000).encode()), 400, None),
    ("deep JSON in an unsupported field", CHAT, _chat()[:-1] + b', "tools": '
     + _deep(5000).encode() + b"}", 400, None),
    ("invalid UTF-8 in a string", CHAT, _chat().replace(b"hello", b"he\xff\xfello"), 400, None),
    ("lone surrogate escape", CHAT, _chat().replace(b"hello", b"he\\ud800llo"), 400, None),
    ("empty stop string", CHAT, _chat(stop=""), 400, "stop"),
    ("empty stop string in a list", CHAT, _chat(stop=["a", ""]), 400, "stop[1]"),
    ("seed beyond int64", CHAT, _chat(seed=2**70), 400, "seed"),
    ("priority far out of range", CHAT, _chat(priority=10**30), 400, "priority"),
    ("priority below the range", CHAT, _chat(priority=-(2**63)), 400, "priority"),
    ("max_tokens beyond any int", CHAT, _chat(max_tokens=10**30), 400, "max_tokens"),
    ("temperature infinite", CHAT, _chat()[:-1] + b', "temperature": 1e400}', 400,
     "temperature"),
    ("unknown field", CHAT, _chat(frobnicate=1), 400, "frobnicate"),
    ("tools", CHAT, _chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400,
     "tools"),
    ("response_format json", CHAT, _chat(response_format={"type": "json_object"}), 400,
     "response_format"),
    ("logprobs", CHAT, _chat(logprobs=True), 400, "logprobs"),
    ("top_logprobs", CHAT, _chat(top_logprobs=3), 400, "top_logprobs"),
    ("logit_bias", CHAT, _chat(logit_bias={"12": 5}), 400, "logit_bias"),
    ("best_of", CMPL, json.dumps({"model": MODEL, "prompt": "hi", "best_of": 2}).encode(), 400,
     "best_of"),
    ("echo", CMPL, json.dumps({"model": MODEL, "prompt": "hi", "echo": True}).encode(), 400,
     "echo"),
    ("suffix", CMPL, json.dumps({"model": MODEL, "prompt": "hi", "suffix": "x"}).encode(), 400,
     "suffix"),
    ("logprobs 0 on completions", CMPL, json.dumps({"model": MODEL, "prompt": "hi",
                                                    "logprobs": 0}).encode(), 400, "logprobs"),
    ("tool call in history", CHAT, _chat(messages=[
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]), 400,
     "messages[0].tool_calls"),
    ("role of the wrong type", CHAT, _chat(messages=[{"role": 5, "content": "x"}]), 400,
     "messages[0].role"),
    ("messages not a list", CHAT, _chat(messages="hi"), 400, "messages"),
    ("no messages", CHAT, _chat(messages=[]), 400, "messages"),
    ("image part", CHAT, _chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]), 400, "messages[0].content"),
    ("body is an array", CHAT, b"[]", 400, None),
    ("body is null", CHAT, b"null", 400, None),
    ("trailing garbage", CHAT, _chat() + b"}", 400, None),
    ("n = 2", CHAT, _chat(n=2), 400, "n"),
    ("prompt batch", CMPL, json.dumps({"model": MODEL, "prompt": [[1, 2], [3]]}).encode(), 400,
     "prompt"),
    ("token id out of the vocabulary", CMPL, json.dumps({"model": MODEL,
                                                         "prompt": [10**30]}).encode(), 400,
     "prompt"),
    ("unknown model", CHAT, _chat(model="gpt-9"), 400, "model"),
]

HARMLESS = [
    {"user": "u1", "metadata": {"k": "v"}, "store": False, "service_tier": "auto"},
    {"logprobs": False, "top_logprobs": None, "tools": [], "tool_choice": "none",
     "parallel_tool_calls": False, "response_format": {"type": "text"}, "logit_bias": {}},
]


@pytest_asyncio.fixture
async def http(smollm2_model: Path) -> AsyncIterator[httpx.AsyncClient]:
    config = Config(model=ModelConfig(path=str(smollm2_model), max_model_len=512),
                    engine=EngineConfig(kind="sim", max_num_seqs=2),
                    scheduler=SchedulerConfig(max_running=2))
    service = await Service.create(config)
    await service.start()
    transport = httpx.ASGITransport(app=build_app(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client
        assert service.scheduler.num_jobs == 0  # no refused request left a job behind
    await service.shutdown()


@pytest.mark.parametrize(("name", "path", "body", "status", "param"), CORPUS,
                         ids=[case[0] for case in CORPUS])
async def test_bad_input_is_a_4xx_naming_the_field(http: httpx.AsyncClient, name: str,
                                                   path: str, body: bytes, status: int,
                                                   param: str | None) -> None:
    response = await http.post(path, content=body,
                               headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    if param is not None:
        assert error["param"] == param, error


@pytest.mark.parametrize("fields", HARMLESS)
async def test_harmless_fields_are_accepted(http: httpx.AsyncClient,
                                            fields: dict[str, object]) -> None:
    response = await http.post(CHAT, content=_chat(**fields),
                               headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] >= 1
