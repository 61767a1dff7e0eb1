"""Response bodies as vLLM's server encodes them (daemon/http/responses.py): a chat message
leaves out tool_calls unless a tool was called, bodies carry their `object`, unset members
are null."""

from __future__ import annotations

import json

import msgspec

from daemon.http.responses import (
    ChatCompletion,
    ChatMessageOut,
    Completion,
    Delta,
    FunctionCallOut,
    ToolCallDelta,
    ToolCallOut,
    Usage,
)


def test_chat_message_leaves_out_tool_calls_unless_called() -> None:
    plain = json.loads(msgspec.json.encode(ChatMessageOut("assistant", "hello")))
    assert plain == {"role": "assistant", "content": "hello", "reasoning": None}
    call = ToolCallOut("call-1", FunctionCallOut("f", "{}"))
    called = json.loads(msgspec.json.encode(ChatMessageOut("assistant", "", [call])))
    assert called["tool_calls"] == [{"id": "call-1", "type": "function",
                                     "function": {"name": "f", "arguments": "{}"}}]


def test_bodies_say_what_they_are() -> None:
    chat = json.loads(msgspec.json.encode(ChatCompletion("id", 1, "m", [], Usage(1, 1, 2))))
    assert chat["object"] == "chat.completion" and chat["prompt_logprobs"] is None
    completion = json.loads(msgspec.json.encode(Completion("id", 1, "m", [])))
    assert completion["object"] == "text_completion"


def test_stream_deltas_carry_only_what_they_say() -> None:
    assert msgspec.json.encode(Delta(content="x")) == b'{"content":"x"}'
    call = ToolCallDelta(0, function={"arguments": "{"})
    assert json.loads(msgspec.json.encode(Delta(tool_calls=[call]))) == {
        "tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}
