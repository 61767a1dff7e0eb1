"""Anthropic's own client (the `anthropic` package) against the real daemon (SmolLM2,
float32, the session's daemon): `messages.create` whole and streamed (its stream reader
rebuilds the same message from the events), `messages.count_tokens`, and a tool's round
trip (a named tool's tool_use block, whole and streamed, then its tool_result sent back).
The client no longer has `temperature` (Anthropic's API dropped it); vLLM's server, and
lengthwise, still take it: `extra_body` sends it, for answers the test can compare."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import pytest

from tests.support import DaemonProcess

pytestmark = pytest.mark.engine

MODEL = "smollm2-135m-instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0.0}
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "required": ["city"],
                            "properties": {"city": {"type": "string",
                                                    "enum": ["Paris", "Rome"]}},
                            "additionalProperties": False}}


@pytest.fixture
def client(smollm2_daemon: DaemonProcess) -> Iterator[anthropic.Anthropic]:
    """Closed after the test (tests.support.openai_client says why)."""
    with anthropic.Anthropic(base_url=smollm2_daemon.base_url, api_key="unused",
                             max_retries=0) as made:
        yield made


def test_create_whole_and_streamed_and_count_tokens(client: anthropic.Anthropic) -> None:
    ask = {"model": MODEL, "max_tokens": 12, "messages": QUESTION, "extra_body": GREEDY,
           "system": "Answer in one sentence."}
    whole = client.messages.create(**ask)  # type: ignore[call-overload]
    assert whole.type == "message" and whole.role == "assistant"
    assert [b.type for b in whole.content] == ["text"] and "Paris" in whole.content[0].text
    assert whole.stop_reason in ("end_turn", "max_tokens")
    with client.messages.stream(**ask) as stream:  # type: ignore[arg-type]
        pieces = list(stream.text_stream)
        streamed = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == whole.content[0].text
    assert streamed.content[0].text == whole.content[0].text  # type: ignore[union-attr]
    assert (streamed.stop_reason, streamed.usage.output_tokens) == \
        (whole.stop_reason, whole.usage.output_tokens)
    counted = client.messages.count_tokens(model=MODEL, messages=QUESTION,  # type: ignore
                                           system="Answer in one sentence.")
    assert counted.input_tokens == whole.usage.input_tokens == streamed.usage.input_tokens


def test_a_tool_round_trip(client: anthropic.Anthropic) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    tool = {"model": MODEL, "max_tokens": 30, "extra_body": GREEDY, "tools": [WEATHER],
            "tool_choice": {"type": "tool", "name": "get_weather"}, "messages": ask}
    whole = client.messages.create(**tool)  # type: ignore[call-overload]
    (call,) = whole.content
    assert call.type == "tool_use" and call.name == "get_weather"
    assert call.input["city"] in ("Paris", "Rome")  # type: ignore[index]
    assert whole.stop_reason == "tool_use"
    with client.messages.stream(**tool) as stream:  # type: ignore[arg-type]
        streamed = stream.get_final_message()
    assert [(b.type, b.input) for b in streamed.content] == \
        [("tool_use", call.input)]  # type: ignore[union-attr]
    answer = client.messages.create(  # type: ignore[call-overload]
        model=MODEL, max_tokens=8, extra_body=GREEDY, tools=[WEATHER],
        tool_choice={"type": "none"}, messages=[
            *ask, {"role": "assistant", "content": [{"type": "tool_use", "id": call.id,
                                                     "name": call.name, "input": call.input}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                          "content": "Sunny, 24 C"}]}])
    assert answer.content[0].type == "text" and answer.usage.input_tokens > \
        whole.usage.input_tokens


def test_errors_are_the_clients_exceptions(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        client.messages.create(model=MODEL, max_tokens=0, messages=QUESTION)  # type: ignore
    with pytest.raises(anthropic.BadRequestError, match="model"):
        client.messages.create(model="claude-opus-4-1", max_tokens=5,
                               messages=QUESTION)  # type: ignore[arg-type]
