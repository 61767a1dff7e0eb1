"""Real clients against the real daemon (SmolLM2, float32): the `openai` package sends vLLM's
extensions the way its users do (extra_body for what OpenAI's API lacks) and reads them back
through its own types; vLLM's own benchmark client completes every request with its default
backend (`openai`, /v1/completions: it always sends `repetition_penalty`, ...) and with its
chat backend."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from bench import vllm_client
from bench.metrics import RequestResult
from bench.workload.spec import Message, Request
from tests.support import SMOLLM2, DaemonProcess

pytestmark = pytest.mark.engine

MODEL = "smollm2-135m-instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
        "required": ["city"], "additionalProperties": False}


def test_chat_logprobs_one_position_per_token(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=5, temperature=0, logprobs=True,
        top_logprobs=3)  # type: ignore[arg-type]
    choice = answer.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    content = choice.logprobs.content
    assert answer.usage is not None and len(content) == answer.usage.completion_tokens == 5
    assert "".join(c.token for c in content) == choice.message.content
    for c in content:  # greedy: the chosen token is the most likely candidate
        assert len(c.top_logprobs) == 3 and c.top_logprobs[0].token == c.token
        assert c.logprob == c.top_logprobs[0].logprob <= 0


def test_n_choices_each_their_own_sample(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, n=3,
                                          temperature=1.0, seed=7)  # type: ignore[arg-type]
    assert [c.index for c in chat.choices] == [0, 1, 2]
    assert len({c.message.content for c in chat.choices}) > 1  # seeds 7, 8, 9
    assert chat.usage is not None and chat.usage.completion_tokens == 18
    completion = client.completions.create(model=MODEL, prompt="Paris is", max_tokens=4, n=2,
                                           temperature=0.9, seed=3)
    assert [c.index for c in completion.choices] == [0, 1]
    with pytest.raises(openai.BadRequestError, match="greedy"):  # as vLLM refuses it
        client.completions.create(model=MODEL, prompt="Paris is", max_tokens=4, n=2,
                                  temperature=0)


def test_lm_eval_loglikelihood_batch_of_token_id_prompts(client: openai.OpenAI
                                                         ) -> None:
    """lm-evaluation-harness's shape: token-id prompts in one batch, echo, logprobs, one
    token: every prompt token's logprob comes back (the first has none)."""
    prompts = [[504, 3575, 282, 4649, 314], [12366, 314, 253]]
    answer = client.completions.create(
        model=MODEL, prompt=prompts, echo=True, logprobs=1, max_tokens=1, temperature=0)
    assert [c.index for c in answer.choices] == [0, 1]
    for prompt, choice in zip(prompts, answer.choices, strict=True):
        lp = choice.logprobs
        assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
        assert len(lp.tokens) == len(prompt) + 1
        assert lp.token_logprobs[0] is None
        assert all(x is not None and x <= 0 for x in lp.token_logprobs[1:])
    assert answer.usage is not None and answer.usage.prompt_tokens == 8


def test_response_format_json_schema(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=30, temperature=0,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "city", "schema": CITY}})
    content = answer.choices[0].message.content
    assert content is not None and json.loads(content)["city"] in ("Paris", "Rome")


def test_named_tool_choice_calls_the_tool(client: openai.OpenAI) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    answer = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=30,
                                            temperature=0, tools=[WEATHER],
                                            tool_choice=named)  # type: ignore[arg-type]
    message = answer.choices[0].message
    assert message.tool_calls and message.tool_calls[0].function.name == "get_weather"
    whole = json.loads(message.tool_calls[0].function.arguments)
    assert isinstance(whole["city"], str)
    # streamed: the same call, in tool call deltas
    arguments, names = "", []
    for chunk in client.chat.completions.create(
            model=MODEL, messages=ask, max_tokens=30, temperature=0, tools=[WEATHER],
            tool_choice=named, stream=True):  # type: ignore[call-overload]
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                names += [call.function.name] if call.function.name else []
                arguments += call.function.arguments or ""
    assert names == ["get_weather"] and json.loads(arguments) == whole


BACKENDS = ["openai", "openai-chat"]


@pytest.fixture(scope="module")
def bench_client_runs(smollm2_daemon: DaemonProcess, tmp_path_factory: pytest.TempPathFactory
                      ) -> tuple[Path, dict[str, list[RequestResult]]]:
    """vLLM's bench client with each backend, one run after the other in one process, as
    `bench compare --client vllm` and `bench sweep` drive it (bench/vllm_client.py): forced
    lengths, Gamma arrivals (CV 2 at 20 req/s), a salted prompt. (Its start, ~19 CPU-s, is
    paid once here for the benchmarks' driver and the compatibility check both.)"""
    folder = tmp_path_factory.mktemp("vllm-bench-client")
    requests = [Request(k, 0.0, [Message("user", f"Tell me about the number {k}.")], 12, 6 + k)
                for k in range(6)]
    return folder, vllm_client.run_each(
        smollm2_daemon.base_url, requests, folder, {b: b for b in BACKENDS}, rate=20.0,
        cv=2.0, seed=1, natural=False, salt="run 1. ", tokenizer=SMOLLM2, max_model_len=2048)


@pytest.mark.parametrize("backend", BACKENDS)
def test_vllm_bench_client_completes_every_request(
        bench_client_runs: tuple[Path, dict[str, list[RequestResult]]], backend: str) -> None:
    """Every request completes with its forced length, and what vLLM's client saved comes
    back as our results, request by request, in order."""
    folder, runs = bench_client_runs
    results = runs[backend]
    assert [r.index for r in results] == list(range(6))
    assert all(r.ok for r in results), [r.error for r in results]
    assert [r.output_tokens for r in results] == [6 + k for k in range(6)]  # ignore_eos
    assert min(r.arrival_s for r in results) == 0.0
    assert all(0 < r.ttft_s <= r.jct_s for r in results)
    saved = json.loads((folder / f"{backend}.result.json").read_text())
    assert saved["completed"] == 6 and saved["failed"] == 0
    assert saved["backend"] == backend
    assert saved["burstiness"] == vllm_client.burstiness(2.0)
    sent = [json.loads(line) for line in (folder / f"{BACKENDS[0]}.jsonl").read_text().splitlines()]
    assert [line["output_tokens"] for line in sent] == [6 + k for k in range(6)]
    assert all(line["prompt"].startswith("run 1. Tell me about the number") for line in sent)
