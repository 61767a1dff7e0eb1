"""/v1/responses in-process (ASGI, simulated executor; daemon/http/openai_responses.py and
its parts): bad input is a 4xx naming the field before a job exists, the typed event
sequence, the store (retrieve, previous_response_id, store=false, eviction), background
responses (queued -> completed, replayed streams, cancel), SLO headers; and the
conversation vLLM builds from input items and stored history. The engine differential is
tests/integration/test_differential.py, the real clients test_responses_clients.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import pytest_asyncio

from daemon.config import Config, EngineConfig, ModelConfig, PredictorConfig, SchedulerConfig
from daemon.http import responses_input as inp
from daemon.http.response_store import Entry, ResponseStore
from daemon.http.responses_objects import OutputMessage, OutputText
from daemon.http.responses_schemas import ResponsesRequest
from daemon.http.schemas import ChatMessage
from daemon.http.slo import TTFT_HEADER
from daemon.service import Service
from tests.support import in_process

ON_THE_MODULES_LOOP = pytest.mark.asyncio(loop_scope="module")

WEATHER = {"type": "function", "name": "get_weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
SHORT = {"input": "hello", "max_output_tokens": 3}


Rig = tuple[httpx.AsyncClient, Service, list[str]]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def started(tiny_model: Path) -> AsyncIterator[Rig]:
    """One service for the module (no predictor: every job gets the fallback), with the
    ids of the jobs submitted to it."""
    config = Config(model=ModelConfig(path=str(tiny_model), max_model_len=512),
                    engine=EngineConfig(kind="sim", max_num_seqs=2),
                    scheduler=SchedulerConfig(max_running=2),
                    predictor=PredictorConfig(path="none", iterative_path="none"))
    async with in_process(config) as (http, service):
        await service.start()
        submitted: list[str] = []
        submit = service.submit

        def counting(job: Any) -> Any:
            submitted.append(job.job_id)
            return submit(job)

        service.submit = counting  # type: ignore[method-assign]
        yield http, service, submitted


@pytest.fixture
def rig(started: Rig) -> Rig:
    started[2].clear()
    return started


def _events(body: str) -> list[dict[str, Any]]:
    """The SSE events, each checked to name its type twice (event: line and data)."""
    out = []
    for block in body.strip().split("\n\n"):
        kind, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        out.append(event)
    return out


BAD = [  # (body, status, param)
    ({"input": "x", "tool_choice": "required"}, 400, "tool_choice"),
    ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "no"}},
     400, "tool_choice"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
    ({"input": "x", "background": True, "store": False}, 400, "background"),
    ({"input": "x", "prompt": {"id": "pmpt_1"}}, 400, "prompt"),
    ({"input": "x", "bogus": 1}, 400, "bogus"),
    ({"max_output_tokens": 3}, 400, "input"),
    ({"input": []}, 400, "input"),
    ({"input": "x", "previous_response_id": "resp_nope"}, 404, "response_id"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, 400, "input"),
    ({"input": [{"type": "function_call", "name": "f"}]}, 400, "input[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
     400, "input[0].content[0]"),
    ({"input": "x", "text": {"format": {"type": "json_object"}},
      "structured_outputs": {"json_object": True}}, 400, "structured_outputs"),
    ({"input": "x", "max_output_tokens": 0}, 400, "max_output_tokens"),
    ({"input": "x", "temperature": 3}, 400, "temperature"),
    ({"input": "x", "stop_token_ids": [10**9]}, 400, "stop_token_ids"),
    ({"input": "x", "include": ["message.output_text.logprobs"], "top_logprobs": 50}, 400,
     "logprobs"),
    ({"input": "hello " * 600}, 400, "input"),
    ({"input": "x", "model": "other"}, 400, "model"),
]


@ON_THE_MODULES_LOOP
@pytest.mark.parametrize(("body", "status", "param"), BAD)
async def test_bad_input_is_a_4xx_naming_the_field_before_a_job(
        rig: Rig, body: dict[str, Any], status: int,
        param: str) -> None:
    http, _, submitted = rig
    response = await http.post("/v1/responses", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert submitted == []


@ON_THE_MODULES_LOOP
async def test_stream_sends_vllms_event_sequence(
        rig: Rig) -> None:
    http = rig[0]
    response = await http.post("/v1/responses", json={**SHORT, "stream": True})
    assert response.headers["content-type"].startswith("text/event-stream")
    events = _events(response.text)
    kinds = [e["type"] for e in events]
    deltas = kinds.count("response.output_text.delta")  # merged when the reader lags
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * deltas,
                     "response.output_text.done", "response.content_part.done",
                     "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert final["output"][0]["content"][0]["text"] == text == events[-4]["text"]
    assert final["status"] == "incomplete" and final["usage"]["output_tokens"] == 3
    assert {e["item_id"] for e in events[3:-2]} == {final["output"][0]["id"]}
    assert events[0]["response"]["status"] == "in_progress"


@ON_THE_MODULES_LOOP
async def test_store_retrieve_and_previous_response_id(
        rig: Rig) -> None:
    http = rig[0]
    first = (await http.post("/v1/responses", json={**SHORT, "instructions": "Be brief."})
             ).json()
    got = await http.get(f"/v1/responses/{first['id']}")
    assert got.status_code == 200 and got.json() == first
    # a malformed query parameter is a 400 even where it would not be used (as vLLM's route)
    bad = await http.get(f"/v1/responses/{first['id']}", params={"starting_after": "x"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "starting_after"
    second = (await http.post("/v1/responses", json={
        **SHORT, "previous_response_id": first["id"]})).json()
    assert second["previous_response_id"] == first["id"]
    assert second["usage"]["input_tokens"] > first["usage"]["input_tokens"]
    unstored = (await http.post("/v1/responses", json={**SHORT, "store": False})).json()
    assert (await http.get(f"/v1/responses/{unstored['id']}")).status_code == 404
    done = await http.post(f"/v1/responses/{first['id']}/cancel")
    assert done.status_code == 400 and done.json()["error"]["param"] == "response_id"
    api = http._transport.app.state.responses  # type: ignore[attr-defined]
    api.store.max_responses = 1  # the next response evicts the others
    try:
        await http.post("/v1/responses", json=SHORT)
        assert (await http.get(f"/v1/responses/{second['id']}")).status_code == 404
    finally:
        api.store.max_responses = 10_000


@ON_THE_MODULES_LOOP
async def test_background_runs_after_the_reply_and_can_be_cancelled(
        rig: Rig) -> None:
    http, service, submitted = rig
    queued = (await http.post("/v1/responses", json={**SHORT, "background": True})).json()
    assert queued["status"] == "queued" and queued["output"] == [] and len(submitted) == 1
    deadline = time.monotonic() + 60  # generous: the test machine may be loaded
    while True:
        polled = (await http.get(f"/v1/responses/{queued['id']}")).json()
        if polled["status"] not in ("queued", "in_progress") or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    assert polled["status"] == "incomplete" and polled["usage"]["output_tokens"] == 3
    streamed = await http.post("/v1/responses", json={**SHORT, "background": True,
                                                      "stream": True})
    events = _events(streamed.text)
    replay = await http.get(f"/v1/responses/{events[0]['response']['id']}",
                            params={"stream": "true", "starting_after": "2"})
    assert _events(replay.text) == events[3:]
    long = (await http.post("/v1/responses", json={
        "input": "hi", "max_output_tokens": 400, "background": True})).json()
    cancelled = await http.post(f"/v1/responses/{long['id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert (await http.get(f"/v1/responses/{long['id']}")).json()["status"] == "cancelled"
    deadline = time.monotonic() + 60
    while service.scheduler.num_jobs and time.monotonic() < deadline:  # the job is aborted
        await asyncio.sleep(0.02)
    assert service.scheduler.num_jobs == 0


@ON_THE_MODULES_LOOP
async def test_slo_headers_are_honoured(rig: Rig) -> None:
    http, _, submitted = rig
    ok = await http.post("/v1/responses", json=SHORT, headers={TTFT_HEADER: "60000"})
    assert ok.status_code == 200 and "x-lengthwise-predicted-ttft-ms" in ok.headers
    bad = await http.post("/v1/responses", json=SHORT, headers={TTFT_HEADER: "soon"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == TTFT_HEADER
    assert len(submitted) == 1


def _req(**fields: Any) -> ResponsesRequest:
    return msgspec.convert(fields, ResponsesRequest)


def test_conversation_as_vllm_builds_it() -> None:
    """Instructions do not carry over; the previous output is an assistant message; input
    items join earlier input items only (a function call to the assistant message before
    it); a call's output is a tool message."""
    history = [ChatMessage(role="system", content="old"), ChatMessage(role="user", content="a")]
    previous = [OutputMessage("msg_1", [OutputText("b")])]
    req = _req(instructions="new", input=[
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "done"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        {"role": "developer", "content": "hint"}])
    got = inp.conversation(req, history, previous)
    assert [(m.role, m.content) for m in got] == [
        ("system", "new"), ("user", "a"), ("assistant", "b"), ("assistant", None),
        ("tool", "done"), ("assistant", "ok"), ("developer", "hint")]
    assert [c.id for c in got[3].tool_calls or []] == ["c1", "c2"]
    assert history[1].content == "a" and got[2].tool_calls is None
    assert inp.continues_final(_req(input=[{"role": "assistant", "content": "x",
                                            "status": "incomplete"}]))


def test_store_is_bounded_by_count_and_bytes() -> None:
    store = ResponseStore(max_responses=3, max_bytes=10_000)
    for k in range(5):
        store.put(f"r{k}", Entry([ChatMessage(role="user", content="x")]))
    assert len(store) == 3 and store.get("r0") is None and store.get("r2") is not None
    store.put("r5", Entry([ChatMessage(role="user", content="x")]))  # r2 was used: r3 goes
    assert store.get("r3") is None and store.get("r2") is not None
    store.put("big", Entry([ChatMessage(role="user", content="y" * 9_990)]))
    assert len(store) == 1 and store.num_bytes == store.get("big").size  # type: ignore[union-attr]


def test_a_framed_text_delta_is_the_encoded_event() -> None:
    """The per-token path frames a text delta around its text and number: the bytes equal
    the event encoded whole."""
    from daemon.http.responses_objects import TextDelta
    from daemon.http.responses_output import Events

    events = Events()
    first = events.text("Hel")  # events 0-2: the message opens, its first delta
    framed = events.text('lo "x"\n')
    item_id = json.loads(first.split(b"\n\n")[0].split(b"data: ")[1])["item"]["id"]
    whole = msgspec.json.encode(TextDelta(0, 'lo "x"\n', item_id, [], 0, 3))
    assert framed == b"event: response.output_text.delta\ndata: " + whole + b"\n\n"
