"""Anthropic's Messages API (daemon/http/anthropic*.py): requests become the chat requests
vLLM's own converter makes of them (its `to_chat_completion_request` is the oracle); the
answer in Anthropic's shapes, streamed (event order, block indices, tool_use blocks, text
held behind a tool call) and whole; bad input a 4xx in Anthropic's error shape naming the
field, before a job exists; `x-api-key`. In-process (ASGI) on the simulated executor; the
real engine and vLLM's own server: tests/integration/test_differential.py (messages_cases.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import pytest_asyncio

from daemon.config import Config, EngineConfig, ModelConfig, SchedulerConfig, ServerConfig
from daemon.http import anthropic_render, translate
from daemon.http.anthropic_convert import template_probe, to_chat
from daemon.http.anthropic_schemas import AnthropicMessagesRequest
from daemon.service import Service
from daemon.tokenizer import TemplateError, Tokenizer
from daemon.toolcalls import CallDelta, ParsedDelta
from tests.support import in_process

MODEL = "tiny-llama"
KEY = "sk-anthropic-0123456789abcdef"
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"properties": {"city": {"type": "string"}}}}
HISTORY = [
    {"role": "user", "content": [{"type": "text", "text": "Weather in"},
                                 {"type": "text", "text": "Paris?", "cache_control": {
                                     "type": "ephemeral"}}]},
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "A tool.", "signature": "s"},
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1",
         "content": [{"type": "text", "text": "sunny"}, {"type": "text", "text": "20C"}]},
        {"type": "text", "text": "And tomorrow?"}]},
    {"role": "system", "content": "Answer briefly."},
    {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t",
                                       "content": "odd"}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "x"}]},
]
# Each exercises one part of vLLM's conversion; the last of each pair adds what changes.
REQUESTS: list[dict[str, Any]] = [
    {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
    {"max_tokens": 50, "messages": HISTORY, "stop_sequences": ["\n\n"], "temperature": 0.5,
     "top_p": 0.9, "top_k": 4, "system": [
         {"type": "text", "text": "x-anthropic-billing-header: cc=1"},
         {"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
    {"max_tokens": 2000, "messages": HISTORY[:3], "tools": [WEATHER],
     "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
     "thinking": {"type": "enabled", "budget_tokens": 1024}},
    {"max_tokens": 9, "messages": HISTORY[:1], "tools": [WEATHER],
     "tool_choice": {"type": "tool", "name": "get_weather"},
     "output_config": {"effort": "high", "format": {"type": "json_schema",
                                                    "schema": {"type": "object"}}}},
    {"max_tokens": 9, "tools": [WEATHER], "thinking": {"type": "disabled"}, "messages": [
        {"role": "system", "content": [
            {"type": "tool_addition", "tool": {"type": "tool_definition", "definition": {
                "name": "clock", "input_schema": {"type": "object"}}}},
            {"type": "tool_removal", "tool": {"type": "tool_reference",
                                              "name": "get_weather"}}]},
        {"role": "user", "content": "time?"}]},
]


def _config(model: Path, **server: Any) -> Config:
    return Config(server=ServerConfig(**server),
                  model=ModelConfig(path=str(model), max_model_len=2048,
                                    tool_call_parser="pythonic"),
                  engine=EngineConfig(kind="sim", max_num_seqs=2),
                  scheduler=SchedulerConfig(max_running=2))


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def served(tiny_model: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Service]]:
    async with in_process(_config(tiny_model)) as both:
        yield both


@pytest_asyncio.fixture(loop_scope="module")
async def http(served: tuple[httpx.AsyncClient, Service]) -> AsyncIterator[httpx.AsyncClient]:
    client, service = served
    yield client
    assert service.scheduler.num_jobs == 0  # every request ended, refused or not


def _vllm_chat(body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's own conversion of `body` (its Anthropic server's), as builtins."""
    from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest as VLLMRequest
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages

    chat = AnthropicServingMessages.to_chat_completion_request(
        VLLMRequest.model_validate({"model": MODEL, **body}), merge_inline_system=False,
        disabled_thinking_effort="none")
    return dict(chat.model_dump(mode="json"))


def _text(content: Any) -> str:
    """A message's content as the template gets it (vLLM: text parts, one per line)."""
    if content is None or isinstance(content, str):
        return content or ""
    return "\n".join(part["text"] for part in content)


def _call(call: Any) -> tuple[str, str, Any]:
    function = call["function"] if isinstance(call, dict) else call.function
    if isinstance(call, dict):
        return call["id"], function["name"], json.loads(function["arguments"])
    return call.id, function.name, json.loads(function.arguments)


@pytest.mark.parametrize("body", REQUESTS, ids=range(len(REQUESTS)))
def test_the_chat_request_vllms_converter_makes(body: dict[str, Any]) -> None:
    want = _vllm_chat(body)
    got = to_chat(msgspec.convert({"model": MODEL, **body}, AnthropicMessagesRequest),
                  merge_inline_system=False, disabled_effort="none")
    assert [m["role"] for m in want["messages"]] == [m.role for m in got.messages]
    template, _ = translate.chat_messages(got)
    for theirs, ours, entry in zip(want["messages"], got.messages, template, strict=True):
        assert _text(theirs.get("content")) == entry["content"]
        assert [_call(c) for c in theirs.get("tool_calls") or []] == \
            [_call(c) for c in ours.tool_calls or []]
        assert theirs.get("tool_call_id") == ours.tool_call_id
        assert theirs.get("reasoning") == ours.reasoning
    for field in ("max_tokens", "max_completion_tokens", "stop", "temperature", "top_p",
                  "top_k", "reasoning_effort", "thinking_token_budget",
                  "parallel_tool_calls"):
        assert want[field] == getattr(got, field), field
    choice = want["tool_choice"]
    assert (choice["function"]["name"] if isinstance(choice, dict) else choice) == \
        (got.tool_choice if isinstance(got.tool_choice, str | None)
         else got.tool_choice.function.name)
    assert [(t["function"]["name"], t["function"]["parameters"])
            for t in want["tools"] or []] == \
        [(t.function.name, t.function.parameters) for t in got.tools or []]
    fmt = want["response_format"]  # vLLM's field is `json_schema`, aliased "schema"
    assert (fmt and fmt["json_schema"]["json_schema"]) == \
        (got.response_format and got.response_format.json_schema and
         got.response_format.json_schema.schema)


def test_template_probe_as_vllm(tiny_model: Path) -> None:
    """The tiny model's template takes a later system message, and renders every effort
    alike (so "disabled" thinking asks for "low"); a template that refuses both merges."""
    tok = Tokenizer(str(tiny_model))

    def render(messages: list[dict[str, Any]], effort: str | None, gen: bool) -> str | None:
        return tok.render_chat(messages, add_generation_prompt=gen,
                               template_kwargs={"reasoning_effort": effort})

    assert template_probe(render) == (False, "low")
    assert template_probe(lambda *_: None) == (True, "low")
    efforts = template_probe(lambda m, effort, g: None if len(m) > 2 else f"{effort}")
    assert efforts == (True, "none")
    with pytest.raises(TemplateError):
        tok.render_chat([{"role": "user", "content": ["not", "text"]}])


@pytest.mark.parametrize(("finish", "stop", "used", "complete", "want"), [
    ("length", "x", True, True, ("max_tokens", None)),
    ("stop", "\n\n", False, False, ("stop_sequence", "\n\n")),
    ("stop", "\n\n", True, True, ("tool_use", None)),  # complete calls run
    ("stop", "\n\n", True, False, ("stop_sequence", "\n\n")),  # a cut call must not
    ("stop", 2, False, False, ("end_turn", None)),  # a stop token id is no sequence
    ("tool_calls", None, True, False, ("tool_use", None)),
    ("abort", None, False, False, (None, None)),
])
def test_stop_reasons_as_vllm(finish: str, stop: Any, used: bool, complete: bool,
                              want: tuple[str | None, str | None]) -> None:
    assert anthropic_render.stop_reason(finish, stop, used, complete) == want


def _events(body: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for chunk in body.split("\n\n"):
        if chunk:
            name, data = chunk.split("\n", 1)
            event = json.loads(data.removeprefix("data: "))
            assert name == f"event: {event['type']}"
            out.append((event["type"], event))
    return out


def test_text_behind_a_tool_call_follows_it_in_its_own_block() -> None:
    """vLLM's order: a tool call opens its block; text the parser gives meanwhile waits and
    comes after, in a text block of its own; another call closes the one before."""
    blocks = anthropic_render._Blocks()
    parsed = anthropic_render._Parsed(blocks)
    out = parsed.events(ParsedDelta(content="Let me see. "))
    out += parsed.events(ParsedDelta(calls=(CallDelta(0, "c0", "f", '{"a": '),)))
    out += parsed.events(ParsedDelta(content="later", calls=(CallDelta(0, arguments="1}"),)))
    out += parsed.events(ParsedDelta(calls=(CallDelta(1, "c1", "g", "{}"),)))
    out += blocks.close()
    events = _events(b"".join(out).decode())
    assert [(e["type"], e.get("index")) for _, e in events] == [
        ("content_block_start", 0), ("content_block_delta", 0), ("content_block_stop", 0),
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_delta", 1),
        ("content_block_stop", 1), ("content_block_start", 2), ("content_block_delta", 2),
        ("content_block_stop", 2),
        ("content_block_start", 3), ("content_block_delta", 3), ("content_block_stop", 3)]
    assert events[3][1]["content_block"] == {"type": "tool_use", "id": "c0", "name": "f",
                                            "input": {}}
    assert events[8][1]["delta"] == {"type": "text_delta", "text": "later"}
    assert blocks.tool_used and blocks.tool_complete


async def _stream(http: httpx.AsyncClient, body: dict[str, Any]) -> list[tuple[str, Any]]:
    response = await http.post("/v1/messages", json={"model": MODEL, "stream": True, **body})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return _events(response.text)


@pytest.mark.asyncio(loop_scope="module")
async def test_a_stream_in_anthropics_event_order(http: httpx.AsyncClient) -> None:
    events = await _stream(http, {"max_tokens": 6, "system": "Be brief.",
                                  "messages": [{"role": "user", "content": "hi"}]})
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "content_block_start"]
    assert set(names[2:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert (start["role"], start["content"], start["stop_reason"]) == ("assistant", [], None)
    count = await http.post("/v1/messages/count_tokens", json={
        "model": MODEL, "system": "Be brief.", "messages": [{"role": "user", "content": "hi"}]})
    prompt = count.json()["input_tokens"]
    assert start["usage"] == {"input_tokens": prompt, "output_tokens": 0}
    end = events[-2][1]
    assert end["usage"] == {"input_tokens": prompt, "output_tokens": 6}
    assert end["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    text = "".join(e["delta"]["text"] for name, e in events if name == "content_block_delta")
    assert text.strip()


@pytest.mark.asyncio(loop_scope="module")
async def test_a_named_tool_streams_its_input_and_a_cut_one_is_refused_whole(
        http: httpx.AsyncClient) -> None:
    """The simulated model writes no JSON: streamed, the tool_use block carries what it
    wrote (stop_reason max_tokens); whole, the cut call is vLLM's 400."""
    ask = {"max_tokens": 4, "tools": [WEATHER], "messages": [{"role": "user", "content": "?"}],
           "tool_choice": {"type": "tool", "name": "get_weather"}}
    events = await _stream(http, ask)
    assert events[1][1]["content_block"]["name"] == "get_weather"
    pieces = [e["delta"]["partial_json"] for name, e in events if name == "content_block_delta"]
    assert len(pieces) >= 1 and events[-2][1]["delta"]["stop_reason"] == "max_tokens"
    whole = await http.post("/v1/messages", json={"model": MODEL, **ask})
    assert whole.status_code == 400
    assert whole.json()["error"]["message"].startswith("max_tokens: ")


@pytest.mark.asyncio(loop_scope="module")
async def test_a_whole_message(http: httpx.AsyncClient) -> None:
    response = await http.post("/v1/messages", json={
        "model": MODEL, "max_tokens": 3, "metadata": {"user_id": "u"},
        "cache_control": {"type": "ephemeral"}, "service_tier": "auto", "speed": "standard",
        "inference_geo": "us", "messages": [{"role": "user", "content": "hi"}]})
    body = response.json()
    assert response.status_code == 200 and response.headers["x-request-id"] == body["id"]
    assert (body["type"], body["role"], body["model"]) == ("message", "assistant", MODEL)
    assert [b["type"] for b in body["content"]] == ["text"]
    assert body["stop_reason"] == "max_tokens" and "stop_sequence" not in body
    assert body["usage"]["output_tokens"] == 3


# (what, fields over a good request, the field named, whether count_tokens has it too)
BAD: list[tuple[str, dict[str, Any], str, bool]] = [
    ("no max_tokens", {"max_tokens": None}, "max_tokens", False),
    ("max_tokens 0", {"max_tokens": 0}, "max_tokens", False),
    ("unknown field", {"frobnicate": 1}, "frobnicate", True),
    ("wrong model", {"model": "claude-opus-4"}, "model", True),
    ("empty stop sequence", {"stop_sequences": [""]}, "stop_sequences[0]", False),
    ("temperature out of range", {"temperature": 3}, "temperature", False),
    ("a role Anthropic lacks", {"messages": [{"role": "tool", "content": "x"}]},
     "messages[0].role", True),
    ("a block type Anthropic lacks", {"messages": [{"role": "user", "content": [
        {"type": "video"}]}]}, "messages[0].content[0].type", True),
    ("an image on a text-only model", {"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}]},
     "messages[0].content[0]", True),
    ("tool_addition outside a system message", {"messages": [{"role": "user", "content": [
        {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "f"}}]}]},
     "messages[0].content[0]", True),
    ("a named tool choice without a name", {"tools": [WEATHER], "tool_choice": {
        "type": "tool"}}, "tool_choice.name", True),
    ("a tool choice naming no tool", {"tools": [WEATHER], "tool_choice": {
        "type": "tool", "name": "nope"}}, "tool_choice", True),
    ("thinking budget over max_tokens", {"max_tokens": 1024, "thinking": {
        "type": "enabled", "budget_tokens": 1024}}, "thinking.budget_tokens", False),
    ("more than the context", {"max_tokens": 5000}, "max_tokens", False),
    ("an unknown tool field", {"tools": [{**WEATHER, "colour": 1}]}, "colour", True),
]
_COUNTED = ("model", "messages", "system", "tools", "tool_choice", "frobnicate")


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(("fields", "param", "counted"), [b[1:] for b in BAD],
                         ids=[b[0] for b in BAD])
async def test_bad_input_is_a_400_in_anthropics_shape_naming_the_field(
        http: httpx.AsyncClient, fields: dict[str, Any], param: str, counted: bool) -> None:
    body = {k: v for k, v in {"model": MODEL, "max_tokens": 5, "messages": [
        {"role": "user", "content": "hi"}], **fields}.items() if v is not None}
    paths = {"/v1/messages": body}
    if counted:
        paths["/v1/messages/count_tokens"] = {k: v for k, v in body.items() if k in _COUNTED}
    for path, sent in paths.items():
        response = await http.post(path, json=sent)
        assert response.status_code == 400, (path, response.text)
        error = response.json()
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
        assert error["error"]["message"].startswith(f"{param}: "), (path, error)


@pytest.mark.asyncio(loop_scope="module")
async def test_count_tokens_counts_what_the_chat_route_would_run(
        http: httpx.AsyncClient) -> None:
    body = {"model": MODEL, "system": "Be brief.", "messages": HISTORY[:3]}
    counted = (await http.post("/v1/messages/count_tokens", json=body)).json()
    chat = to_chat(msgspec.convert({**body, "max_tokens": 1}, AnthropicMessagesRequest),
                   merge_inline_system=False, disabled_effort="low")
    tokens = await http.post("/tokenize", json={
        "model": MODEL, "messages": msgspec.to_builtins(chat.messages)})
    assert counted == {"input_tokens": tokens.json()["count"],
                       "context_management": {"original_input_tokens": tokens.json()["count"]}}


@pytest.mark.asyncio(loop_scope="module")
async def test_anthropics_key_header_and_its_401(tiny_model: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY} name=user\n")
    ask = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    async with in_process(_config(tiny_model, api_keys_file=str(keys))) as (client, _):
        ok = await client.post("/v1/messages", json=ask, headers={"x-api-key": KEY})
        assert ok.status_code == 200, ok.text
        refused = await client.post("/v1/messages", json=ask, headers={"x-api-key": "no"})
        assert refused.status_code == 401
        assert refused.json()["error"]["type"] == "authentication_error"
        bearer = await client.post("/v1/messages/count_tokens", json=ask,
                                   headers={"authorization": f"Bearer {KEY}"})
        assert bearer.status_code == 400  # authorized; max_tokens is no count_tokens field

