"""vLLM's own tool parsers behind daemon.toolcalls: fixed model text through the real parser
classes (pythonic, hermes) and the model's real tokenizer, whole and token by token as the
stream feeds them; names vLLM does not know, or whose tokens the tokenizer lacks, refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from daemon.executors.vllm_tools import VLLMToolParsing
from daemon.tokenizer import Tokenizer
from daemon.toolcalls import ParsedDelta

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object",
                                          "properties": {"city": {"type": "string"}}}}}
# The daemon's request as msgspec.to_builtins gives it: every field, unset ones null.
REQUEST: dict[str, Any] = {
    "model": "m", "tools": [WEATHER], "tool_choice": "auto", "parallel_tool_calls": None,
    "messages": [{"role": "user", "content": "Weather in Paris and Oslo?", "name": None},
                 {"role": "assistant", "content": None, "tool_calls": [{
                     "id": "c1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{}"}}]},
                 {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]}
TWO_CALLS = "[get_weather(city='Paris'), get_weather(city='Oslo')]"


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Tokenizer:
    return Tokenizer(str(tiny_model))


def _stream(parsing: VLLMToolParsing, tokenizer: Tokenizer, text: str
            ) -> list[ParsedDelta]:
    """The text token by token, as the stream's deltas come, then the end."""
    reader = parsing.reader(REQUEST, [1, 2, 3])
    out = []
    for token_id in tokenizer.encode(text):
        out.append(reader.delta(tokenizer.decode_one(token_id), [token_id], False))
    out.append(reader.delta("", [], True))
    return [d for d in out if d is not None]


def test_pythonic_calls_in_a_whole_answer(tokenizer: Tokenizer) -> None:
    parsing = VLLMToolParsing("pythonic", tokenizer.hf)
    content, calls = parsing.reader(REQUEST, [1]).whole(TWO_CALLS, [])
    assert content is None
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("chatcmpl-tool-")
                                                   for c in calls)
    content, calls = parsing.reader(REQUEST, [1]).whole("It is sunny.", [])
    assert (content, calls) == ("It is sunny.", [])


def test_pythonic_calls_streamed_as_incremental_deltas(tokenizer: Tokenizer) -> None:
    parsing = VLLMToolParsing("pythonic", tokenizer.hf)
    deltas = [d for d in _stream(parsing, tokenizer, TWO_CALLS) if d.calls]
    calls = [c for d in deltas for c in d.calls]
    assert len(deltas) > 2  # not one final delta
    for index, city in enumerate(("Paris", "Oslo")):
        mine = [c for c in calls if c.index == index]
        assert [c.name for c in mine if c.name] == ["get_weather"]
        assert mine[0].id is not None and all(c.id is None for c in mine[1:])
        assert json.loads("".join(c.arguments or "" for c in mine)) == {"city": city}
    text = _stream(parsing, tokenizer, "No tools needed here.")
    assert "".join(d.content or "" for d in text) == "No tools needed here."


def test_hermes_reads_its_tags(tokenizer: Tokenizer) -> None:
    parsing = VLLMToolParsing("hermes", tokenizer.hf)
    text = 'Let me check.<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}' \
           '</tool_call>'
    content, calls = parsing.reader(REQUEST, [1]).whole(text, [])
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Rome"})]


@pytest.mark.parametrize(("name", "reason"), [("nope", "not been registered"),
                                              ("llama3_json", "<|python_tag|>")])
def test_unknown_or_unfit_parsers_are_refused(tokenizer: Tokenizer, name: str,
                                              reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        VLLMToolParsing(name, tokenizer.hf)
