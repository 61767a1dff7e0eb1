"""The greedy /v1/responses requests the differential sends to vLLM's server and to
lengthwise (tests/integration/test_differential_responses.py): text, streamed and not, a
function tool call read by vLLM's pythonic parser (auto, streamed and not) and a named one,
a json_schema text.format, and a three-turn previous_response_id chain that hands a
function call and its output back; each answer as a comparable record (a stream: its
typed events, runs of deltas collapsed, and its final response)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx

from tests.integration import preempt

ASK = "Once upon a time"
BASE = {"model": "tiny-llama", "temperature": 0.0, "max_output_tokens": 10,
        "instructions": "Answer briefly."}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}
# The tiny random model writes what the regex lets it (two calls); vLLM's pythonic parser
# finds them (as in the chat differential).
CALLS = {"tools": [WEATHER], "tool_choice": "auto", "max_output_tokens": 40,
         "structured_outputs": {"regex": r"\[get_weather\(city='(Paris|Rome)'\), "
                                         r"get_weather\(city='Oslo'\)\]"}}
CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
        "required": ["city"], "additionalProperties": False}
ITEMS = [{"role": "user", "content": [{"type": "input_text", "text": ASK}]}]
CASES: dict[str, dict[str, Any]] = {
    "text": {**BASE, "input": ASK, "frequency_penalty": 0.8, "presence_penalty": 0.5},
    "text-stream": {**BASE, "input": ITEMS, "stream": True},
    "tool-call": {**BASE, **CALLS, "input": "Weather in Paris and Oslo?"},
    "tool-call-stream": {**BASE, **CALLS, "input": "Weather in Paris and Oslo?",
                         "stream": True},
    "named-tool": {**BASE, "input": "Weather?", "tools": [WEATHER], "max_output_tokens": 30,
                   "tool_choice": {"type": "function", "name": "get_weather"},
                   "structured_outputs": None},
    "json-schema": {**BASE, "input": "A city?", "max_output_tokens": 30, "text": {
        "format": {"type": "json_schema", "name": "city", "schema": CITY}}},
    "json-schema-stream": {**BASE, "input": "A city?", "max_output_tokens": 30, "stream": True,
                           "text": {"format": {"type": "json_schema", "name": "city",
                                               "schema": CITY}}},
}
# Streamed, long; a short request arrives once PREEMPT_AFTER deltas of it are out (alise
# preempts it for that one).
LONG = {**BASE, "input": ASK, "max_output_tokens": 300, "ignore_eos": True, "stream": True,
        "frequency_penalty": 0.8}
PREEMPT_AFTER = 8
# Differ by design: ids, clocks, and the engine's prefix-cache hits (lengthwise does not
# report them: cached_tokens is 0).
IGNORED = {"id", "call_id", "item_id", "created_at", "previous_response_id", "cached_tokens"}


def _events(lines: Iterator[str], on_delta: Any = None) -> dict[str, Any]:
    """A stream as a record: event types in order with runs of one delta type collapsed
    (servers may merge deltas differently), the sequence numbers, the delta texts joined,
    and the final response."""
    kinds: list[str] = []
    numbers: list[int] = []
    deltas: dict[str, str] = {}
    final: dict[str, Any] = {}
    for line in lines:
        if not line.startswith("data: "):
            continue
        event = json.loads(line[6:])
        kind = event["type"]
        numbers.append(event["sequence_number"])
        if kind.endswith(".delta"):
            deltas[kind] = deltas.get(kind, "") + event["delta"]
            if on_delta is not None:
                on_delta()
        if not (kinds and kinds[-1] == kind and kind.endswith(".delta")):
            kinds.append(kind)
        if kind == "response.completed":
            final = event["response"]
        assert kind != "error", event
    return {"events": kinds, "in_order": numbers == list(range(len(numbers))),
            "deltas": deltas, "final": final}


def call(client: httpx.Client, body: dict[str, Any], on_delta: Any = None) -> dict[str, Any]:
    body = {k: v for k, v in body.items() if v is not None}
    if not body.get("stream"):
        response = client.post("/v1/responses", json=body)
        assert response.status_code == 200, response.text
        return dict(response.json())
    with client.stream("POST", "/v1/responses", json=body) as response:
        assert response.status_code == 200, response.read()
        return _events(response.iter_lines(), on_delta)


def chain(client: httpx.Client) -> list[dict[str, Any]]:
    """Three turns: the second continues the first, the third hands back a function call
    and its output (the history stored by the server, the turns' instructions not)."""
    first = call(client, {**BASE, "input": "Hello"})
    second = call(client, {**BASE, "input": "And then?", "instructions": None,
                           "previous_response_id": first["id"]})
    third = call(client, {**BASE, "previous_response_id": second["id"], "input": [
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C"}],
        "tools": [WEATHER]})
    return [first, second, third]


def run_all(base_url: str) -> dict[str, Any]:
    with httpx.Client(base_url=base_url, timeout=120) as client:
        out = {name: call(client, body) for name, body in CASES.items()}
        out["chain"] = chain(client)
        return out


def long_reference(base_url: str) -> dict[str, Any]:
    with httpx.Client(base_url=base_url, timeout=120) as client:
        return call(client, LONG)


def preempted(base_url: str) -> dict[str, Any]:
    """LONG, with a short request sent once PREEMPT_AFTER of its events are out."""
    return preempt.while_streaming(
        base_url, lambda client, tick: call(client, LONG, tick), PREEMPT_AFTER,
        lambda client: call(client, {**BASE, "input": "Hi", "max_output_tokens": 2}))
