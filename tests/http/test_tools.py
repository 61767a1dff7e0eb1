"""Tools on /v1/chat/completions: vLLM's checks and 400s, the JSON schema that constrains a
named or "required" tool choice, the calls read out of a constrained answer; in-process
(simulated engine) "auto" is refused in vLLM's words without a tool parser and served,
whole and streamed, with one (the sim's made-up text holds no call: it comes as content)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import pytest_asyncio

from daemon.config import Config, EngineConfig, ModelConfig, SchedulerConfig
from daemon.http import tools
from daemon.http.errors import ApiError
from daemon.http.responses import ErrorInfo
from daemon.http.schemas import ChatCompletionRequest, NamedToolChoice
from tests.support import in_process

MODEL = "smollm2-135m-instruct"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object",
                                          "properties": {"city": {"type": "string"}}}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
AUTO_WORDS = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser'


def _req(**fields: Any) -> ChatCompletionRequest:
    return msgspec.convert({"messages": ASK, **fields}, ChatCompletionRequest)


def _refused(fields: dict[str, Any], parser: str = "") -> ErrorInfo:
    with pytest.raises(ApiError) as caught:
        tools.choice(_req(**fields), parser)
    assert caught.value.status == 400
    return caught.value.info


def test_choice_defaults_as_vllm() -> None:
    assert tools.choice(_req(), "") == "none"
    assert tools.choice(_req(tools=[WEATHER], tool_choice="none"), "") == "none"
    assert tools.choice(_req(tools=[WEATHER]), "pythonic") == "auto"  # tools, no choice
    named = tools.choice(_req(tools=[WEATHER], tool_choice={
        "type": "function", "function": {"name": "get_weather"}}), "")
    assert isinstance(named, NamedToolChoice) and named.function.name == "get_weather"
    assert tools.choice(_req(tools=[WEATHER], tool_choice="required"), "") == "required"


def test_choice_refusals_in_vllms_words() -> None:
    assert "must not be an empty array" in _refused({"tools": []}).message
    assert "`tools` must be set" in _refused({"tool_choice": "required"}).message
    assert "does not match any" in _refused({"tools": [WEATHER], "tool_choice": {
        "type": "function", "function": {"name": "nope"}}}).message
    error = _refused({"tools": [WEATHER]})  # "auto" by default, no parser
    assert AUTO_WORDS in error.message and error.param == "tool_choice"
    assert "not both" in _refused({"tools": [WEATHER], "tool_choice": "required",
                                   "structured_outputs": {"json": {}}}).message


def test_schema_constrains_the_answer_to_the_call() -> None:
    named = tools.choice(_req(tools=[WEATHER, TIME], tool_choice={
        "type": "function", "function": {"name": "get_weather"}}), "")
    assert json.loads(tools.schema(_req(tools=[WEATHER, TIME]), named) or "") == \
        WEATHER["function"]["parameters"]
    required = json.loads(tools.schema(_req(tools=[WEATHER, TIME]), "required") or "")
    assert required["type"] == "array" and required["minItems"] == 1
    names = [c["properties"]["name"]["enum"] for c in required["items"]["anyOf"]]
    assert names == [["get_weather"], ["get_time"]]
    assert tools.schema(_req(tools=[WEATHER]), "auto") is None


def test_calls_read_from_a_constrained_answer() -> None:
    named = tools.choice(_req(tools=[WEATHER], tool_choice={
        "type": "function", "function": {"name": "get_weather"}}), "")
    (call,) = tools.calls(named, '{"city": "Paris"}') or []
    assert (call.function.name, call.function.arguments) == ("get_weather",
                                                             '{"city": "Paris"}')
    text = '[{"name": "get_weather", "parameters": {"city": "Oslo"}}, ' \
           '{"name": "get_time", "parameters": {}}]'
    calls = tools.calls("required", text) or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Oslo"}), ("get_time", {})]
    assert tools.calls("required", '[{"name": "get_wea') == []  # cut by max_tokens
    assert tools.calls("auto", "anything") is None


def test_template_tools_in_openais_shape() -> None:
    assert tools.template_tools(_req(tools=[TIME])) == [
        {"type": "function", "function": {"name": "get_time"}}]


@pytest_asyncio.fixture(params=["", "pythonic"])
async def client(request: pytest.FixtureRequest, smollm2_model: Path
                 ) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    config = Config(model=ModelConfig(path=str(smollm2_model), max_model_len=512,
                                      tool_call_parser=request.param),
                    engine=EngineConfig(kind="sim", max_num_seqs=2),
                    scheduler=SchedulerConfig(max_running=2))
    async with in_process(config) as (http, _):
        yield http, request.param


@pytest.mark.asyncio
async def test_auto_needs_a_tool_parser(client: tuple[httpx.AsyncClient, str]) -> None:
    http, parser = client
    body = {"model": MODEL, "messages": ASK, "tools": [WEATHER], "max_tokens": 4}
    whole = await http.post("/v1/chat/completions", json=body)
    streamed = await http.post("/v1/chat/completions", json={**body, "stream": True})
    if not parser:
        for response in (whole, streamed):
            assert response.status_code == 400
            assert AUTO_WORDS in response.json()["error"]["message"]
        return
    assert whole.status_code == streamed.status_code == 200
    message = whole.json()["choices"][0]["message"]
    assert message["content"] and "tool_calls" not in message  # no call in made-up text
    assert whole.json()["choices"][0]["finish_reason"] == "length"
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines()
              if line.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                   if c["choices"])
    assert text == message["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
