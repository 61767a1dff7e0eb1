"""The greedy requests the differential (tests/integration/test_differential.py) sends to
vLLM's server and to lengthwise on Anthropic's Messages API, count_tokens and the render
endpoints: Messages text, streamed and not, a stop sequence that ends after a 4-token slice,
system and content blocks, a tool_use / tool_result history under tools ("auto", vLLM's
pythonic parser), a named tool's call; count_tokens; the chat and completions renders.

A stream is compared merged (one message: its blocks' text and tool input joined, the stop
reason and usage of message_delta) with its event sequence (deltas in a row as one), so
how text is cut into deltas may differ, what the client ends up with may not. The tiny
random model greedily repeats one token; a tool call it writes under a schema never closes
(it writes whitespace), so the named tool's call is cut by max_tokens: streamed, a tool_use
block with what it wrote; whole, vLLM's 400."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx

from tests.integration import preempt

WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}
HISTORY = [
    {"role": "user", "content": [{"type": "text", "text": "Weather in"},
                                 {"type": "text", "text": "Paris?"}]},
    {"role": "assistant", "content": [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1",
         "content": [{"type": "text", "text": "sunny"}, {"type": "text", "text": "20C"}]},
        {"type": "text", "text": "And tomorrow?"}]},
]
SYSTEM = [{"type": "text", "text": "x-anthropic-billing-header: cch=1"},
          {"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]
HELLO = {"max_tokens": 10, "temperature": 0, "system": "Be brief.",
         "messages": [{"role": "user", "content": "Hello"}]}
# Six newlines: the answer's first six tokens, so the match ends after a 4-token slice.
STOPPED = {"max_tokens": 10, "temperature": 0, "stop_sequences": ["\n" * 6],
           "messages": [{"role": "user", "content": "Once upon a time"}]}
TOOLS = {"max_tokens": 8, "temperature": 0, "tools": [WEATHER], "messages": HISTORY}
NAMED = {"max_tokens": 12, "temperature": 0, "tools": [WEATHER],
         "tool_choice": {"type": "tool", "name": "get_weather"},
         "messages": [{"role": "user", "content": "Weather in Paris?"}]}
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "messages": ("/v1/messages", HELLO),
    "messages-stream": ("/v1/messages", {**HELLO, "stream": True}),
    "messages-stop-sequence": ("/v1/messages", STOPPED),
    "messages-stop-sequence-stream": ("/v1/messages", {**STOPPED, "stream": True}),
    "messages-blocks": ("/v1/messages", {**HELLO, "system": SYSTEM, "top_k": 5, "top_p": 0.9,
                                         "messages": HISTORY[:1]}),
    # tools, tool_choice "auto" (vLLM's pythonic parser reads the answer: no call in it)
    "messages-tool-history": ("/v1/messages", TOOLS),
    "messages-tool-history-stream": ("/v1/messages", {**TOOLS, "stream": True}),
    "messages-named-tool": ("/v1/messages", NAMED),
    "messages-named-tool-stream": ("/v1/messages", {**NAMED, "stream": True}),
    "count-tokens": ("/v1/messages/count_tokens", {"system": SYSTEM, "tools": [WEATHER],
                                                   "messages": HISTORY}),
    "render-chat": ("/v1/chat/completions/render", {
        "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 5,
        "temperature": 0, "stop": ["x"], "seed": 3}),
    "render-completions": ("/v1/completions/render", {
        "prompt": ["Once upon a time", "Hi"], "max_tokens": 7, "top_k": 2}),
}
# Streamed, long; a short request arrives once PREEMPT_AFTER events of it are out.
LONG = ("/v1/messages", {"max_tokens": 120, "temperature": 0, "stream": True,
                         "messages": [{"role": "user", "content": "Tell me a story."}]})
PREEMPT_AFTER = 6
# vLLM's SamplingParams defaults, and what it adds for its own generate endpoint only.
SAMPLING_DEFAULTS = {"n": 1, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                     "repetition_penalty": 1.0, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
                     "min_p": 0.0, "max_tokens": 16, "stop": [], "stop_token_ids": [],
                     "bad_words": [], "min_tokens": 0}
ENGINE_ONLY = {"output_kind", "skip_clone", "skip_reading_prefix_cache"}


def _events(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    name = None
    for line in lines:
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
            assert data["type"] == name, (name, data)
            yield name, data


def merge(lines: Iterator[str]) -> dict[str, Any]:
    """A Messages stream as one message: the blocks' text and tool input joined, message
    _delta's stop reason and usage, and the event names (deltas in a row as one)."""
    message: dict[str, Any] = {}
    blocks: dict[int, dict[str, Any]] = {}
    names: list[str] = []
    for name, data in _events(lines):
        assert name != "error", data
        if not (name == "content_block_delta" and names[-1:] == [name]):
            names.append(name)
        if name == "message_start":
            message = data["message"]
        elif name == "content_block_start":
            blocks[data["index"]] = dict(data["content_block"])
        elif name == "content_block_delta":
            block, delta = blocks[data["index"]], data["delta"]
            key = "text" if delta["type"] == "text_delta" else "partial_json"
            block[key] = block.get(key, "") + delta[key]
        elif name == "message_delta":
            message.update(data["delta"], usage=data["usage"])
    message["content"] = [blocks[i] for i in sorted(blocks)]
    message["events"] = names
    return message


def _rendered(body: dict[str, Any]) -> dict[str, Any]:
    """What a render answer says of the prompt and its settings (vLLM's defaults left out)."""
    params = {k: v for k, v in body["sampling_params"].items()
              if k not in ENGINE_ONLY and SAMPLING_DEFAULTS.get(k, None) != v}
    return {"token_ids": body["token_ids"], "sampling_params": params,
            **{k: body[k] for k in ("model", "stream", "priority", "cache_salt",
                                    "output_mode")}}


def call(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    body = {"model": "tiny-llama", **body}
    if body.get("stream"):
        with client.stream("POST", path, json=body) as response:
            assert response.status_code == 200, response.read()
            return merge(response.iter_lines())
    response = client.post(path, json=body)
    if response.status_code != 200:  # the error's words differ; its status may not
        assert "error" in response.json(), response.text
        return {"status": response.status_code}
    if path.endswith("/render"):
        got = response.json()
        return {"rendered": [_rendered(one) for one in got]} if isinstance(got, list) \
            else _rendered(got)
    return dict(response.json())


def run_all(base_url: str) -> dict[str, Any]:
    with httpx.Client(base_url=base_url, timeout=120) as client:
        return {name: call(client, path, body) for name, (path, body) in CASES.items()}


def long_reference(base_url: str) -> dict[str, Any]:
    with httpx.Client(base_url=base_url, timeout=120) as client:
        return call(client, *LONG)


def preempted(base_url: str) -> dict[str, Any]:
    """LONG, with a short request sent once PREEMPT_AFTER of its events are out (alise
    preempts LONG for it)."""

    def long(client: httpx.Client, tick: preempt.Tick) -> dict[str, Any]:
        return preempt.streamed(client, *LONG, merge, tick)

    # event, data and a blank line per event
    return preempt.while_streaming(base_url, long, 3 * PREEMPT_AFTER, lambda client: call(
        client, "/v1/messages", {"max_tokens": 2, "messages": [
            {"role": "user", "content": "Hi"}]}))
