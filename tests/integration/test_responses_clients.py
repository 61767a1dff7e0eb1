"""Real clients of /v1/responses against the real daemon (SmolLM2, float32): the `openai`
package's responses.create (whole and streamed, read through its own typed events) and
responses.retrieve, and the OpenAI Agents SDK running one agent turn that calls a function
tool and answers from its result."""

from __future__ import annotations

import asyncio
from typing import Literal

import agents
import openai
import pytest

from tests.support import DaemonProcess

pytestmark = pytest.mark.engine

MODEL = "smollm2-135m-instruct"
ASK = "What is the capital of France?"


def test_create_and_retrieve(client: openai.OpenAI) -> None:
    made = client.responses.create(model=MODEL, input=ASK, max_output_tokens=8,
                                   temperature=0, instructions="Answer in one sentence.")
    assert made.status in ("completed", "incomplete") and "Paris" in made.output_text
    assert made.usage is not None and 0 < made.usage.output_tokens <= 8
    again = client.responses.retrieve(made.id)
    assert again.output_text == made.output_text and again.status == made.status
    follow = client.responses.create(model=MODEL, input="And of Italy?", max_output_tokens=8,
                                     temperature=0, previous_response_id=made.id)
    assert follow.usage is not None and follow.usage.input_tokens > made.usage.input_tokens


def test_create_streamed_events(client: openai.OpenAI) -> None:
    events = list(client.responses.create(
        model=MODEL, input=ASK, max_output_tokens=8, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1]
    assert final.type == "response.completed" and final.response.output_text == deltas
    assert "Paris" in deltas


def test_an_agent_calls_a_tool_and_answers(smollm2_daemon: DaemonProcess) -> None:
    agents.set_tracing_disabled(True)  # nothing leaves the machine
    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"It is sunny in {city}."

    # The first turn must call the tool (a named tool choice); the SDK then resets the
    # choice and the model answers from the tool's output.
    async def turn() -> object:
        client = openai.AsyncOpenAI(base_url=smollm2_daemon.base_url + "/v1",
                                    api_key="unused", max_retries=0)
        async with client:
            model = agents.OpenAIResponsesModel(model=MODEL, openai_client=client)
            agent = agents.Agent(name="weather", instructions="Answer briefly.", model=model,
                                 tools=[get_weather], model_settings=agents.ModelSettings(
                                     tool_choice="get_weather", temperature=0,
                                     max_tokens=16))
            result = await agents.Runner.run(agent, "What is the weather in Paris?",
                                             max_turns=3)
            return result.final_output

    answer = asyncio.run(turn())
    assert calls == ["Paris"]
    assert isinstance(answer, str) and answer
