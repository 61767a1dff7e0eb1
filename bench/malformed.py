"""A corpus of malformed and unsupported OpenAI requests, each with the status it must get
and the field its error must name (None: no single field). Used by the tests and by
`lengthwise chaos`."""

from __future__ import annotations

import json
from typing import NamedTuple

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"


class Case(NamedTuple):
    name: str
    path: str
    body: bytes
    status: int
    param: str | None


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def corpus(model: str) -> list[Case]:
    def chat(**fields: object) -> bytes:
        return json.dumps({"model": model, "messages": [{"role": "user", "content": "hello"}],
                           "max_tokens": 2, **fields}).encode()

    def cmpl(**fields: object) -> bytes:
        return json.dumps({"model": model, "prompt": "hi", "max_tokens": 2, **fields}).encode()

    def extra(raw: bytes) -> bytes:  # a field JSON cannot be written by json.dumps
        return chat()[:-1] + b", " + raw + b"}"

    return [
        Case("deep JSON in a typed field", CHAT, extra(b'"user": ' + _deep(1000)), 400, "user"),
        Case("deep JSON in the prompt", CMPL, b'{"model": "%s", "prompt": %s}'
             % (model.encode(), _deep(5000)), 400, None),
        Case("deep JSON in an unsupported field", CHAT, extra(b'"tools": ' + _deep(5000)), 400,
             None),
        Case("invalid UTF-8 in a string", CHAT, chat().replace(b"hello", b"he\xff\xfello"),
             400, None),
        Case("lone surrogate escape", CHAT, chat().replace(b"hello", b"he\\ud800llo"), 400,
             None),
        Case("empty stop string", CHAT, chat(stop=""), 400, "stop"),
        Case("empty stop string in a list", CHAT, chat(stop=["a", ""]), 400, "stop[1]"),
        Case("seed beyond int64", CHAT, chat(seed=2**70), 400, "seed"),
        Case("priority far out of range", CHAT, chat(priority=10**30), 400, "priority"),
        Case("priority below any range", CHAT, chat(priority=-(2**63)), 400, "priority"),
        Case("max_tokens beyond any int", CHAT, chat(max_tokens=10**30), 400, "max_tokens"),
        Case("temperature infinite", CHAT, extra(b'"temperature": 1e400'), 400, "temperature"),
        Case("unknown field", CHAT, chat(frobnicate=1), 400, "frobnicate"),
        Case("tools", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400,
             "tools"),
        Case("response_format json", CHAT, chat(response_format={"type": "json_object"}), 400,
             "response_format"),
        Case("logprobs", CHAT, chat(logprobs=True), 400, "logprobs"),
        Case("top_logprobs", CHAT, chat(top_logprobs=3), 400, "top_logprobs"),
        Case("logit_bias", CHAT, chat(logit_bias={"12": 5}), 400, "logit_bias"),
        Case("best_of", CMPL, cmpl(best_of=2), 400, "best_of"),
        Case("echo", CMPL, cmpl(echo=True), 400, "echo"),
        Case("suffix", CMPL, cmpl(suffix="x"), 400, "suffix"),
        Case("logprobs 0 on completions", CMPL, cmpl(logprobs=0), 400, "logprobs"),
        Case("tool call in history", CHAT, chat(messages=[
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]), 400,
             "messages[0].tool_calls"),
        Case("role of the wrong type", CHAT, chat(messages=[{"role": 5, "content": "x"}]), 400,
             "messages[0].role"),
        Case("messages not a list", CHAT, chat(messages="hi"), 400, "messages"),
        Case("no messages", CHAT, chat(messages=[]), 400, "messages"),
        Case("image part", CHAT, chat(messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "x"}}]}]), 400, "messages[0].content"),
        Case("body is an array", CHAT, b"[]", 400, None),
        Case("body is null", CHAT, b"null", 400, None),
        Case("trailing garbage", CHAT, chat() + b"}", 400, None),
        Case("n = 2", CHAT, chat(n=2), 400, "n"),
        Case("prompt batch", CMPL, cmpl(prompt=[[1, 2], [3]]), 400, "prompt"),
        Case("token id out of the vocabulary", CMPL, cmpl(prompt=[10**30]), 400, "prompt"),
        Case("unknown model", CHAT, chat(model="gpt-9"), 400, "model"),
    ]
