"""/v1/chat/completions' own parts (daemon/http/chat.py): vLLM's checks, the chat template's
options, echo of a final assistant message, and the whole answer's message under each tool
choice (a constrained call, "required" calls, "auto" read by vLLM's pythonic parser).
Streaming is exercised end to end: tests/http/test_tools.py, tests/integration/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from daemon.core.stream import JobEnd, OutputStream
from daemon.executors.vllm_tools import VLLMToolParsing
from daemon.http import chat, render
from daemon.http.errors import ApiError
from daemon.http.schemas import ChatCompletionRequest
from daemon.tokenizer import Tokenizer

WEATHER = {"type": "function", "function": {"name": "get_weather"}}
ASK = [{"role": "user", "content": "Weather?"}]


def _req(**fields: Any) -> ChatCompletionRequest:
    return msgspec.convert({"messages": ASK, **fields}, ChatCompletionRequest)


def _answer(text: str, finish: str = "stop") -> render.Choice:
    c = render.Choice(0, "job", OutputStream(), [1], "")
    c.text, c.end = [text], JobEnd(finish)
    return c


OPTS = render.Options("m", None)


def test_checks_as_vllm() -> None:
    with pytest.raises(ApiError, match="`logprobs` must be set"):
        chat.check(_req(top_logprobs=2), "")
    with pytest.raises(ApiError, match="logprob_token_ids"):
        chat.check(_req(logprob_token_ids=[1]), "")
    assert chat.check(_req(tools=[WEATHER]), "pythonic") == "auto"


def test_template_options() -> None:
    options = chat.template_options(_req(reasoning_effort="low", tools=[WEATHER],
                                         chat_template_kwargs={"x": 1}))
    assert options["template_kwargs"] == {"x": 1, "reasoning_effort": "low",
                                          "enable_thinking": True}
    assert options["tools"] == [WEATHER] and options["add_generation_prompt"] is True
    with pytest.raises(ApiError, match="Cannot set both"):
        chat.template_options(_req(continue_final_message=True))


def test_echo_repeats_a_final_assistant_message_only() -> None:
    prefill = [*ASK, {"role": "assistant", "content": "It is"}]
    assert chat.echo_text(_req(messages=prefill, echo=True)) == "It is"
    assert chat.echo_text(_req(messages=prefill)) == ""
    assert chat.echo_text(_req(echo=True)) == ""


def test_whole_answer_under_each_tool_choice(tiny_model: Path) -> None:
    plain = chat.whole(_answer("sunny"), OPTS, "none", "")
    assert (plain.message.content, plain.message.tool_calls) == ("sunny", msgspec.UNSET)
    named = chat.check(_req(tools=[WEATHER], tool_choice={
        "type": "function", "function": {"name": "get_weather"}}), "")
    one = chat.whole(_answer('{"city": "Oslo"}'), OPTS, named, "")
    assert one.message.content == "" and one.finish_reason == "stop"  # named: "stop"
    assert [c.function.arguments for c in one.message.tool_calls] == ['{"city": "Oslo"}']
    some = chat.whole(_answer('[{"name": "get_weather", "parameters": {}}]'), OPTS,
                      "required", "")
    assert some.finish_reason == "tool_calls" and len(some.message.tool_calls) == 1

    parsing = VLLMToolParsing("pythonic", Tokenizer(str(tiny_model)).hf)
    body = msgspec.to_builtins(_req(tools=[WEATHER]))
    auto = chat.whole(_answer("[get_weather(city='Rome')]", "length"), OPTS, "auto", "",
                      parsing.reader(body, [1]))
    assert auto.finish_reason == "tool_calls" and auto.message.content is None
    (call,) = auto.message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "Rome"}
    prose = chat.whole(_answer("Rome is sunny."), OPTS, "auto", "", parsing.reader(body, [1]))
    assert (prose.message.content, prose.finish_reason) == ("Rome is sunny.", "stop")
