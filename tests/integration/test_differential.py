"""lengthwise against vLLM's own OpenAI server on the same tiny model and engine settings
(float32, one request at a time): the same greedy requests with logprobs, echo, stop token
ids, repetition / frequency / presence penalties, top_k and min_p, on /v1/completions and
/v1/chat/completions, streamed and not, get the same bodies (token ids, text, finish and
stop reasons, usage, logprobs to 1e-3): served whole (fcfs); cut into 4-token slices (scls
with `slicing = "always"`: every answer is stopped and resumed from prompt + generated
tokens); and, for one long streamed answer, preempted for a shorter request (alise) and
resumed. The same runs send vLLM's Responses API requests (tests/integration/
responses_cases.py: text, a function tool call, json_schema, a previous_response_id chain;
streamed and not) and compare their output, token counts and event sequences; and
Anthropic's Messages API, count_tokens and the render endpoints (tests/integration/
messages_cases.py: text, a stop sequence, content blocks, a tool_use / tool_result history, a
named tool's call; streamed and not), compared merged with their event sequences.

The two servers run one after the other (two engines at once are too heavy for 2 cores):
vLLM's first, then the daemon, which switches policy by reload. The tiny random model's
distribution is nearly flat (logprobs about -9.8 everywhere, near-ties everywhere), so a
lost or repeated token, a flipped argmax or a logprob off by more than rounding shows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from bench.servers import Server, Settings, parse_system
from tests.integration import bodies, messages_cases, preempt, responses_cases
from tests.support import BENCH_KNOBS, ROOT, starting_daemon

pytestmark = pytest.mark.engine

SLICE_TOKENS = 4
# scls cuts every dispatch into SLICE_TOKENS-token slices once the daemon reloads to it;
# alise preempts a running job for a shorter one (no predictor: every job's prediction is
# its budget) and drops its KV (recomputed at the resume). One job runs at a time.
EXTRA = f"""
[policies.scls]
slicing = "always"
slice_tokens = {SLICE_TOKENS}
min_interval_s = 0.05
[policies.alise]
max_resident_jobs = 0
[scheduler.aging]
slowdown = 50.0
[predictor]
path = "none"
iterative_path = "none"
[costmodel]
profile = "{ROOT / 'bench' / 'profiles' / 'tiny-llama-cpu-stack.json'}"
"""
# vLLM's tool parser for tool_choice "auto" on both servers: pythonic reads
# `[name(arg='value'), ...]`, plain text that any tokenizer spells.
PARSER = "pythonic"
STOP = -1  # stands for a token id found in the reference answer (stop_token_ids)
PROMPT = "Once upon a time"
PENALTIES = {"frequency_penalty": 0.8, "presence_penalty": 0.5}
TRUNCATING = {"repetition_penalty": 1.3, "top_k": 5, "min_p": 0.05}
CMPL = {"prompt": PROMPT, "max_tokens": 10, "temperature": 0.0, "return_token_ids": True}
CHAT = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 10,
        "temperature": 0.0, "return_token_ids": True}
USAGE = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "completion-logprobs": ("/v1/completions", {**CMPL, **PENALTIES, "logprobs": 3}),
    "completion-truncating-stream": ("/v1/completions", {**CMPL, **TRUNCATING, "logprobs": 2,
                                                         "stream": True, **USAGE}),
    "completion-stop-id": ("/v1/completions", {**CMPL, **PENALTIES, "logprobs": 1,
                                               "stop_token_ids": [STOP]}),
    "completion-stop-id-stream": ("/v1/completions", {**CMPL, **PENALTIES, "logprobs": 1,
                                                      "stop_token_ids": [STOP],
                                                      "stream": True}),
    # lm-eval's log-likelihood shape: the prompt's logprobs in the answer
    "completion-echo": ("/v1/completions", {**CMPL, "echo": True, "logprobs": 2,
                                            "max_tokens": 1}),
    "chat-logprobs": ("/v1/chat/completions", {**CHAT, **PENALTIES, "logprobs": True,
                                               "top_logprobs": 3}),
    "chat-truncating-stream": ("/v1/chat/completions", {**CHAT, **TRUNCATING,
                                                        "logprobs": True, "top_logprobs": 2,
                                                        "stream": True, **USAGE}),
    "chat-stop-id-stream": ("/v1/chat/completions", {**CHAT, **PENALTIES, "logprobs": True,
                                                     "stop_token_ids": [STOP],
                                                     "stream": True}),
}
# tool_choice "auto" under vLLM's pythonic parser: the tiny model writes what the regex lets
# it (two calls), the parser finds the calls; streamed, they come as incremental deltas.
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object",
                                          "properties": {"city": {"type": "string"}}}}}
TOOLS = {"tools": [WEATHER], "tool_choice": "auto", "max_tokens": 40,
         "structured_outputs": {"regex": r"\[get_weather\(city='(Paris|Rome)'\), "
                                         r"get_weather\(city='Oslo'\)\]"}}
CASES.update({
    "chat-auto-tools": ("/v1/chat/completions", {**CHAT, **TOOLS}),
    "chat-auto-tools-stream": ("/v1/chat/completions", {**CHAT, **TOOLS, "stream": True}),
    "chat-auto-tools-plain": ("/v1/chat/completions", {**CHAT, "tools": [WEATHER]}),
})
# Streamed; a short request arrives once PREEMPT_AFTER chunks of it are out, and alise
# preempts it for that one.
LONG = ("/v1/completions", {**CMPL, **PENALTIES, "max_tokens": 300, "ignore_eos": True,
                            "logprobs": 2, "stream": True})
PREEMPT_AFTER = 8


class Answers(msgspec.Struct):
    reference: dict[str, Any]  # vLLM's server
    whole: dict[str, Any]  # lengthwise, fcfs: no preemption
    cut: dict[str, Any]  # lengthwise, scls slices: stopped and resumed every 4 tokens
    resumes: float  # the daemon's resumes during the sliced run
    long_reference: dict[str, Any]  # vLLM's server, LONG
    long_preempted: dict[str, Any]  # lengthwise, alise: LONG preempted by a short request
    preemptions: float  # the daemon's preemptions
    # /v1/responses (responses_cases): vLLM's, lengthwise's whole and cut; LONG preempted
    responses: dict[str, dict[str, Any]]
    # /v1/messages, count_tokens, the render endpoints (messages_cases): the same
    messages: dict[str, dict[str, Any]]


def _body(body: dict[str, Any], stop_id: int) -> dict[str, Any]:
    ids = body.get("stop_token_ids")
    return body if ids is None else {**body, "stop_token_ids": [stop_id]}


def _call(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    body = {"model": "tiny-llama", **body}
    if not body.get("stream"):
        response = client.post(path, json=body)
        assert response.status_code == 200, response.text
        return dict(response.json())
    with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        return bodies.merge_stream(response.iter_lines())


def _run_all(base_url: str, stop_id: int) -> dict[str, Any]:
    with httpx.Client(base_url=base_url, timeout=120) as client:
        return {name: _call(client, path, _body(body, stop_id))
                for name, (path, body) in CASES.items()}


def _stop_id(base_url: str) -> int:
    """A token of the penalized greedy answer that is not its first (stop ids then end the
    answer in the middle, after a slice boundary); the same for every server."""
    with httpx.Client(base_url=base_url, timeout=120) as client:
        ids = _call(client, "/v1/completions", {**CMPL, **PENALTIES})["choices"][0][
            "token_ids"]
    pick = SLICE_TOKENS + 2
    assert len(ids) > pick and ids[pick] not in ids[:pick], ids
    return int(ids[pick])


def _preempted(base_url: str) -> dict[str, Any]:
    """LONG, with a short request sent once it is under way (alise preempts LONG for it)."""

    def long(client: httpx.Client, tick: preempt.Tick) -> dict[str, Any]:
        return preempt.streamed(client, *LONG, bodies.merge_stream, tick)

    # a data line and a blank one per chunk
    return preempt.while_streaming(base_url, long, 2 * PREEMPT_AFTER, lambda client: _call(
        client, "/v1/completions", {"prompt": "Hi", "max_tokens": 2}))


# Other APIs' requests in the same runs: each module's run_all, long_reference, preempted.
SUITES = {"responses": responses_cases, "messages": messages_cases}


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Answers:
    folder = tmp_path_factory.mktemp("differential")
    flags = ("--enable-auto-tool-choice", "--tool-call-parser", PARSER,
             "--enable-scale-out")  # the render endpoints (lengthwise always serves them)
    # Its EngineCore runs the model itself (no worker process beside it, one spawn and one
    # import of vLLM fewer: ready in ~30 s, not ~46, alone on 2 cores); the answers are the
    # engine's all the same.
    vllm = Server(parse_system("vllm"), Settings(
        model=tiny_model, dtype="float32", vllm_flags=flags,
        vllm_env=(("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),)), folder)
    # Both start at once (their imports and engine start-ups overlap on the two cores);
    # the daemon idles while vLLM's server answers. The policies' tuning is a bench knob.
    with starting_daemon(folder, tiny_model, BENCH_KNOBS, dtype="float32", max_running=1,
                         tool_call_parser=PARSER, extra=EXTRA) as daemon:
        try:
            vllm.wait_ready()
            stop_id = _stop_id(vllm.base_url)
            reference = _run_all(vllm.base_url, stop_id)
            with httpx.Client(base_url=vllm.base_url, timeout=120) as client:
                long_reference = _call(client, *LONG)
            suites = {name: {"reference": cases.run_all(vllm.base_url),
                             "long_reference": cases.long_reference(vllm.base_url)}
                      for name, cases in SUITES.items()}
        finally:
            vllm.stop()
        daemon.wait_ready()
        whole = _run_all(daemon.base_url, stop_id)
        for name, cases in SUITES.items():
            suites[name]["whole"] = cases.run_all(daemon.base_url)
        before = daemon.metric("lengthwise_resume_total")
        daemon.reload_policy("scls")
        cut = _run_all(daemon.base_url, stop_id)
        resumes = daemon.metric("lengthwise_resume_total") - before
        for name, cases in SUITES.items():
            before = daemon.metric("lengthwise_resume_total")
            suites[name]["cut"] = cases.run_all(daemon.base_url)
            suites[name]["resumes"] = {
                "count": daemon.metric("lengthwise_resume_total") - before}
        daemon.reload_policy("alise")
        long_preempted = _preempted(daemon.base_url)
        for name, cases in SUITES.items():
            before = daemon.metric("lengthwise_preemptions_total")
            suites[name]["long_preempted"] = cases.preempted(daemon.base_url)
            suites[name]["preemptions"] = {
                "count": daemon.metric("lengthwise_preemptions_total") - before}
        preemptions = daemon.metric("lengthwise_preemptions_total")
    return Answers(reference, whole, cut, resumes, long_reference, long_preempted,
                   preemptions, suites["responses"], suites["messages"])


@pytest.mark.parametrize("case", list(CASES))
def test_the_same_answer_as_vllms_server(answers: Answers, case: str) -> None:
    assert bodies.differences(bodies.calls_whole(answers.reference[case]),
                              bodies.calls_whole(answers.whole[case])) == []


@pytest.mark.parametrize("case", list(CASES))
def test_the_same_answer_when_stopped_and_resumed_every_4_tokens(answers: Answers,
                                                                 case: str) -> None:
    assert bodies.differences(bodies.calls_whole(answers.reference[case]),
                              bodies.calls_whole(answers.cut[case])) == []


def test_the_sliced_answers_were_resumed(answers: Answers) -> None:
    """Every answer longer than a slice was resumed at least once."""
    longer = sum(len(answers.reference[name]["choices"][0]["token_ids"] or []) > SLICE_TOKENS
                 for name in CASES)
    assert longer >= 5 and answers.resumes >= longer


def test_the_same_answer_when_preempted_for_a_shorter_request(answers: Answers) -> None:
    assert answers.preemptions >= 1
    assert bodies.differences(answers.long_reference, answers.long_preempted) == []


def test_auto_tool_choice_calls_come_whole_and_as_incremental_deltas(answers: Answers
                                                                     ) -> None:
    """Not vacuous: both servers found the two calls; streamed, each call's arguments came
    in several deltas (the merged stream lists every delta)."""
    for got in (answers.reference, answers.whole, answers.cut):
        whole = got["chat-auto-tools"]["choices"][0]
        calls = whole["message"]["tool_calls"]
        assert whole["finish_reason"] == "tool_calls" and not whole["message"]["content"]
        assert [c["function"]["name"] for c in calls] == ["get_weather"] * 2
        assert json.loads(calls[1]["function"]["arguments"]) == {"city": "Oslo"}
        streamed = got["chat-auto-tools-stream"]["choices"][0]
        deltas = streamed["delta"]["tool_calls"]
        assert streamed["finish_reason"] == "tool_calls" and len(deltas) > 4
        for index, call in enumerate(calls):
            pieces = [d["function"].get("arguments") or "" for d in deltas
                      if d["index"] == index]
            assert "".join(pieces) == call["function"]["arguments"]
        plain = got["chat-auto-tools-plain"]["choices"][0]
        assert plain["message"]["content"] and "tool_calls" not in plain["message"]


RESPONSES = [*responses_cases.CASES, "chain"]


@pytest.mark.parametrize("run", ["whole", "cut"])
@pytest.mark.parametrize("case", RESPONSES)
def test_responses_the_same_as_vllms_server(answers: Answers, case: str, run: str) -> None:
    """The whole response object (streamed: the final one, the event sequence with runs of
    deltas collapsed, the deltas' text) but ids and clocks; `cut`: stopped and resumed every
    4 tokens."""
    want, got = answers.responses["reference"][case], answers.responses[run][case]
    assert bodies.differences(want, got, ignored=responses_cases.IGNORED) == []


def test_responses_differential_is_not_vacuous(answers: Answers) -> None:
    """Both servers called the two tools (streamed: in argument deltas), kept to the JSON
    schema, numbered every event in order, answered each turn of the chain from the
    stored history (its prompt grew), and the cut run was resumed."""
    for got in (answers.responses[k] for k in ("reference", "whole", "cut")):
        for name in ("tool-call", "tool-call-stream"):
            body = got[name].get("final", got[name])
            calls = [item for item in body["output"] if item["type"] == "function_call"]
            assert [json.loads(c["arguments"])["city"] for c in calls][1:] == ["Oslo"]
        streamed = got["tool-call-stream"]
        assert streamed["events"].count("response.function_call_arguments.delta") == 2
        for name in ("json-schema", "json-schema-stream"):
            body = got[name].get("final", got[name])
            assert json.loads(body["output"][0]["content"][0]["text"])["city"] in ("Paris", "Rome")
        for name, record in got.items():
            if "events" in record:
                assert record["in_order"] and record["events"][0] == "response.created", name
        turns = [t["usage"]["input_tokens"] for t in got["chain"]]
        assert turns[0] < turns[1] < turns[2]
    assert answers.responses["resumes"]["count"] >= 5


def test_responses_the_same_when_preempted_for_a_shorter_request(answers: Answers) -> None:
    responses = answers.responses
    assert responses["preemptions"]["count"] >= 1
    assert bodies.differences(responses["long_reference"], responses["long_preempted"],
                              ignored=responses_cases.IGNORED) == []


@pytest.mark.parametrize("run", ["whole", "cut"])
@pytest.mark.parametrize("case", list(messages_cases.CASES))
def test_messages_the_same_as_vllms_server(answers: Answers, case: str, run: str) -> None:
    """The message (streamed: merged, with its event sequence), count_tokens' count, the
    renders' token ids and settings, but ids; `cut`: stopped and resumed every 4 tokens."""
    want, got = answers.messages["reference"][case], answers.messages[run][case]
    assert bodies.differences(want, got) == []


def test_messages_differential_is_not_vacuous(answers: Answers) -> None:
    """The answers have the text, stop sequence, tool_use block, 400 and counts the cases
    are about, on both servers; the cut run was resumed."""
    for got in (answers.messages[k] for k in ("reference", "whole", "cut")):
        assert got["messages"]["content"][0]["text"].strip() and \
            got["messages"]["usage"]["output_tokens"] == 10
        stopped = got["messages-stop-sequence-stream"]
        assert (stopped["stop_reason"], stopped["stop_sequence"]) == ("stop_sequence", "\n" * 6)
        assert stopped["usage"]["output_tokens"] == 6 and stopped["content"] == []
        named = got["messages-named-tool-stream"]
        assert [b["type"] for b in named["content"]] == ["tool_use"]
        assert named["content"][0]["partial_json"].startswith('{"') and \
            named["stop_reason"] == "max_tokens"
        assert got["messages-named-tool"] == {"status": 400}
        assert got["messages-tool-history"]["usage"]["input_tokens"] > 40
        assert got["count-tokens"]["input_tokens"] > 40
        assert len(got["render-completions"]["rendered"]) == 2
        assert got["render-chat"]["sampling_params"] == {"max_tokens": 5, "temperature": 0.0,
                                                         "stop": ["x"], "seed": 3}
    assert answers.messages["resumes"]["count"] >= 5


def test_messages_the_same_when_preempted_for_a_shorter_request(answers: Answers) -> None:
    messages = answers.messages
    assert messages["preemptions"]["count"] >= 1
    assert messages["long_reference"]["usage"]["output_tokens"] == 120
    assert bodies.differences(messages["long_reference"], messages["long_preempted"]) == []
