"""The real daemon, the real vLLM engine, the default model, real clients."""

from __future__ import annotations

import asyncio
import re
import signal
import time

import httpx
import openai
import pytest

from tests.support import DaemonProcess

MODEL = "smollm2-135m-instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]

pytestmark = pytest.mark.engine


def test_openai_client_streams_a_chat_completion(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=QUESTION, stream=True, max_tokens=30, temperature=0,
        stream_options={"include_usage": True})
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    text = "".join(pieces)
    assert "Paris" in text
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_stream_and_non_stream_agree_under_greedy(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Write a short poem about the sea."}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24,
                                      temperature=0)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in
                       client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24,
                                                 temperature=0, stream=True) if chunk.choices)
    assert whole.choices[0].message.content == streamed
    assert whole.usage is not None and whole.usage.completion_tokens == 24


def test_completions_stream_and_non_stream(client: openai.OpenAI) -> None:
    whole = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=12,
                                 temperature=0)
    streamed = "".join(chunk.choices[0].text for chunk in client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=12, temperature=0,
        stream=True) if chunk.choices)
    assert whole.choices[0].text == streamed
    assert "Paris" in streamed


def test_models_and_health(smollm2_daemon: DaemonProcess, client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert httpx.get(smollm2_daemon.base_url + "/health").json() == {"status": "ok"}


BAD_BODIES = [
    (b"{not json", "malformed JSON"),
    (b'{"model": "%s", "messages": "hello"}' % MODEL.encode(), "messages"),
    (b'{"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}', "does not exist"),
    (b'{"model": "%s", "messages": []}' % MODEL.encode(), "at least one message"),
    (b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}'
     % MODEL.encode(), "max_tokens"),
    (b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}'
     % MODEL.encode(), "context"),
    (b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "n": 0}'
     % MODEL.encode(), "n"),
    (b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}'
     % MODEL.encode(), "temperature"),
    (b'{"model": "%s", "messages": [{"role": "user", "content": "%s"}]}'
     % (MODEL.encode(), b"word " * 3000), "context"),
]


@pytest.mark.parametrize(("body", "says"), BAD_BODIES)
def test_bad_input_gets_a_clear_400(smollm2_daemon: DaemonProcess, client: openai.OpenAI,
                                    body: bytes, says: str) -> None:
    response = httpx.post(smollm2_daemon.base_url + "/v1/chat/completions", content=body,
                          headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert says in error["message"]
    assert error["type"] == "invalid_request_error"
    # ... and the daemon keeps serving.
    ok = client.chat.completions.create(model=MODEL, messages=QUESTION,
                                                        max_tokens=2)
    assert ok.choices[0].finish_reason in ("length", "stop")


def test_disconnect_mid_stream_aborts_the_job(smollm2_daemon: DaemonProcess) -> None:
    aborted_before = smollm2_daemon.metric("lengthwise_jobs_aborted_total")
    body = {"model": MODEL, "messages": QUESTION, "stream": True, "max_tokens": 1500,
            "ignore_eos": True}
    with httpx.stream("POST", smollm2_daemon.base_url + "/v1/chat/completions", json=body,
                      timeout=60) as response:
        lines = response.iter_lines()
        received = [next(lines) for _ in range(6)]
    assert any(line.startswith("data: ") for line in received)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if (smollm2_daemon.metric("lengthwise_jobs_aborted_total") > aborted_before
                and smollm2_daemon.metric("lengthwise_running_jobs") == 0):
            break
        time.sleep(0.2)
    assert smollm2_daemon.metric("lengthwise_jobs_aborted_total") == aborted_before + 1
    assert smollm2_daemon.metric("lengthwise_running_jobs") == 0


def test_disconnect_while_waiting_for_a_whole_answer_aborts_it(
        smollm2_daemon: DaemonProcess) -> None:
    aborted_before = smollm2_daemon.metric("lengthwise_jobs_aborted_total")
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 1500, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        httpx.post(smollm2_daemon.base_url + "/v1/chat/completions", json=body, timeout=2)
    deadline = time.monotonic() + 20
    while (smollm2_daemon.metric("lengthwise_jobs_aborted_total") == aborted_before
           and time.monotonic() < deadline):
        time.sleep(0.2)
    assert smollm2_daemon.metric("lengthwise_jobs_aborted_total") == aborted_before + 1
    assert smollm2_daemon.metric("lengthwise_running_jobs") == 0


async def _one_stream(c: openai.AsyncOpenAI, i: int) -> tuple[str, str | None]:
    stream = await c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"Count to {i + 3}."}],
        max_tokens=16, stream=True, temperature=0, extra_body={"ignore_eos": True})
    pieces, finish = [], None
    async for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    return "".join(pieces), finish


def test_more_streams_than_slots_all_complete(smollm2_daemon: DaemonProcess) -> None:
    """8 streams against max_running=4: half wait in lengthwise, all finish."""

    async def run() -> list[tuple[str, str | None]]:
        c = openai.AsyncOpenAI(base_url=smollm2_daemon.base_url + "/v1", api_key="unused")
        async with c:
            return await asyncio.gather(*(_one_stream(c, i) for i in range(8)))

    results = asyncio.run(run())
    assert all(text and finish == "length" for text, finish in results)


def test_sighup_reload_changes_a_live_parameter_mid_stream(
        smollm2_daemon: DaemonProcess) -> None:
    config = smollm2_daemon.config_path
    original = config.read_text()
    body = {"model": MODEL, "messages": QUESTION, "stream": True, "max_tokens": 48,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    live = _config_sha256(smollm2_daemon)
    try:
        with httpx.stream("POST", smollm2_daemon.base_url + "/v1/chat/completions", json=body,
                          timeout=120) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            config.write_text(original.replace("max_running = 4", "max_running = 2"))
            smollm2_daemon.signal(signal.SIGHUP)
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]"
        assert "\"completion_tokens\":48" in rest[-2]
        assert "\"finish_reason\":\"length\"" in rest[-3]
        _wait_for_metric(smollm2_daemon, "lengthwise_max_running", 2)
        reloaded = _config_sha256(smollm2_daemon)  # lengthwise_config_info follows it
        assert reloaded != live

        config.write_text("[scheduler]\nmax_running = 'many'\n")  # bad file: rejected
        rejected = smollm2_daemon.log().count("reload rejected")
        smollm2_daemon.signal(signal.SIGHUP)
        deadline = time.monotonic() + 30  # the daemon reads it on its loop, soon but not now
        while smollm2_daemon.log().count("reload rejected") == rejected:
            assert time.monotonic() < deadline, smollm2_daemon.log()[-3000:]
            time.sleep(0.1)
        assert smollm2_daemon.metric("lengthwise_max_running") == 2
        assert _config_sha256(smollm2_daemon) == reloaded
    finally:
        config.write_text(original)
        smollm2_daemon.signal(signal.SIGHUP)
    _wait_for_metric(smollm2_daemon, "lengthwise_max_running", 4)
    assert _config_sha256(smollm2_daemon) == live


def _config_sha256(daemon: DaemonProcess) -> str:
    """The live config's fingerprint, as lengthwise_config_info labels it."""
    text = httpx.get(daemon.base_url + "/metrics", timeout=5).text
    (sha,) = re.findall(r'^lengthwise_config_info\{.*config_sha256="([0-9a-f]{64})".*\} 1\.0$',
                        text, re.MULTILINE)
    return str(sha)


def _wait_for_metric(daemon: DaemonProcess, name: str, value: float) -> None:
    deadline = time.monotonic() + 10
    while daemon.metric(name) != value and time.monotonic() < deadline:
        time.sleep(0.1)
    assert daemon.metric(name) == value
