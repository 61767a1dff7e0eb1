"""The HTTP layer in-process (ASGI) on the simulated executor: shapes, errors, limits."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import msgspec
import pytest
import pytest_asyncio

from bench import promtext
from daemon.config import (
    Config,
    EngineConfig,
    ModelConfig,
    PredictorConfig,
    SchedulerConfig,
    ServerConfig,
)
from daemon.http.app import build_app
from daemon.service import Service, config_sha256

MODEL = "smollm2-135m-instruct"
HELLO = [{"role": "user", "content": "hello"}]


def _config(model: Path, predictor: PredictorConfig | None = None) -> Config:
    return Config(server=ServerConfig(max_body_bytes=20_000),
                  model=ModelConfig(path=str(model), max_model_len=512),
                  engine=EngineConfig(kind="sim", max_num_seqs=2),
                  scheduler=SchedulerConfig(max_running=2, max_waiting=2),
                  predictor=predictor or PredictorConfig())


@pytest_asyncio.fixture
async def client(smollm2_model: Path, request: pytest.FixtureRequest,
                 ) -> AsyncIterator[tuple[httpx.AsyncClient, Service]]:
    service = await Service.create(_config(smollm2_model, getattr(request, "param", None)))
    app = build_app(service)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        yield http, service
    await service.shutdown()


def _events(body: str) -> list[str]:
    return [line.removeprefix("data: ") for line in body.split("\n\n") if line]


@pytest.mark.asyncio
async def test_not_ready_until_engines_start(client: tuple[httpx.AsyncClient, Service]) -> None:
    http, service = client
    assert (await http.get("/health")).status_code == 503
    response = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": HELLO})
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "server_error"
    await service.start()
    assert (await http.get("/health")).json() == {"status": "ok"}


@pytest.mark.asyncio
async def test_ping_is_health_by_get_and_post(client: tuple[httpx.AsyncClient, Service]
                                              ) -> None:
    """vLLM's and SageMaker's liveness path answers as /health does."""
    http, service = client
    for method in ("GET", "POST"):
        assert (await http.request(method, "/ping")).status_code == 503
    await service.start()
    for method in ("GET", "POST"):
        response = await http.request(method, "/ping")
        assert (response.status_code, response.json()) == (200, {"status": "ok"})


@pytest.mark.asyncio
async def test_openapi_covers_every_route(client: tuple[httpx.AsyncClient, Service]) -> None:
    """Each route and method the app serves is in /openapi.json (but the document itself
    and /metrics, which is Prometheus text)."""
    http, _ = client
    doc = (await http.get("/openapi.json")).json()
    app = http._transport.app  # type: ignore[attr-defined]  # the fixture's ASGI app
    served = {(route.path, method.lower()) for route in app.routes
              for method in route.methods or () if method != "HEAD"}
    documented = {(path, method) for path, item in doc["paths"].items() for method in item}
    assert served - documented == {("/openapi.json", "get"), ("/metrics", "get")}
    assert documented <= served


@pytest.mark.asyncio
async def test_chat_stream_shape(client: tuple[httpx.AsyncClient, Service]) -> None:
    http, service = client
    await service.start()
    response = await http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": HELLO, "max_tokens": 5, "stream": True, "ignore_eos": True,
        "stream_options": {"include_usage": True}})
    assert response.headers["content-type"].startswith("text/event-stream")
    events = _events(response.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")) == 5
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    assert response.headers["x-request-id"] == chunks[0]["id"]
    assert float(response.headers["x-lengthwise-predicted-tokens"]) >= 1


@pytest.mark.asyncio
async def test_completion_accepts_token_ids(client: tuple[httpx.AsyncClient, Service]) -> None:
    http, service = client
    await service.start()
    response = await http.post("/v1/completions", json={
        "model": MODEL, "prompt": [1, 2, 3], "max_tokens": 4, "ignore_eos": True})
    body = response.json()
    assert body["object"] == "text_completion"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    bad = await http.post("/v1/completions", json={"model": MODEL, "prompt": [1, 10**9]})
    assert bad.status_code == 400 and "token ids" in bad.json()["error"]["message"]
    # A batch of token-id prompts (lm-eval): one choice per prompt, in order.
    batch = await http.post("/v1/completions", json={
        "model": MODEL, "prompt": [[1, 2], [3, 4, 5]], "max_tokens": 2, "ignore_eos": True})
    assert batch.status_code == 200, batch.text
    assert [c["index"] for c in batch.json()["choices"]] == [0, 1]
    assert batch.json()["usage"]["prompt_tokens"] == 5


@pytest.mark.asyncio
async def test_limits_413_and_429(client: tuple[httpx.AsyncClient, Service]) -> None:
    http, service = client
    await service.start()
    big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 30_000}]}
    response = await http.post("/v1/chat/completions", json=big)
    assert response.status_code == 413
    # Fill 2 slots and 2 waiting places, then one more is refused with 429.
    for _ in range(2):
        service.submit(service.new_job([1, 2], _long(), 0, "fill"))
    while service.scheduler.num_running < 2:
        await asyncio.sleep(0.001)
    for _ in range(2):
        service.submit(service.new_job([1, 2], _long(), 0, "fill"))
    response = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": HELLO})
    assert response.status_code == 429
    assert response.json()["error"]["type"] == "rate_limit_error"
    await service.scheduler.abort_all(timeout_s=5)


def _long():  # type: ignore[no-untyped-def]
    from daemon.core.job import SamplingSpec

    return SamplingSpec(max_tokens=400, ignore_eos=True)


@pytest.mark.asyncio
@pytest.mark.parametrize(("body", "param"), [
    ({"model": MODEL, "messages": HELLO, "top_p": 0}, "top_p"),
    ({"model": MODEL, "messages": HELLO, "temperature": 3}, "temperature"),
    ({"model": MODEL, "messages": [{"role": 7, "content": "x"}]}, "messages[0].role"),
    ({"model": MODEL, "messages": HELLO, "max_completion_tokens": 600}, "max_tokens"),
    ({"model": MODEL, "messages": HELLO, "top_k": -2}, "top_k"),
    ({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content"),
])
async def test_bad_fields_name_the_param(client: tuple[httpx.AsyncClient, Service],
                                         body: dict[str, object], param: str) -> None:
    http, service = client
    await service.start()
    response = await http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


@pytest.mark.asyncio
async def test_metrics_count_tokens_and_latencies(
        client: tuple[httpx.AsyncClient, Service]) -> None:
    http, service = client
    await service.start()
    for _ in range(3):
        await http.post("/v1/chat/completions", json={"model": MODEL, "messages": HELLO,
                                                      "max_tokens": 7, "ignore_eos": True})
    # Cut by its budget (the sim's answers are >= 16 tokens): no true length to compare.
    await http.post("/v1/chat/completions", json={"model": MODEL, "messages": HELLO,
                                                  "max_tokens": 5})
    await http.post("/v1/chat/completions", content=b"{")
    text = (await http.get("/metrics")).text
    assert 'lengthwise_tokens_generated_total{executor="sim0"} 26.0' in text
    assert 'lengthwise_jct_seconds_count{executor="sim0"} 4.0' in text
    for phase in ("predict", "queue", "engine"):  # every served job's TTFT, split in three
        assert f'lengthwise_ttft_phase_seconds_count{{phase="{phase}"}} 4.0' in text
    assert promtext.total(text, "lengthwise_ttft_phase_seconds_sum") == pytest.approx(promtext.total(text, "lengthwise_ttft_seconds_sum"))
    # The forced lengths (ignore_eos + max_tokens) are the truth the predictions are held to.
    assert "lengthwise_prediction_log2_ratio_count 3.0" in text
    assert 'lengthwise_http_errors_total{status="400",type="invalid_request_error"} 1.0' in text
    assert "lengthwise_queue_depth 0.0" in text
    assert "lengthwise_prediction_scale 1.0" in text  # nothing learned yet
    for kv in ("offloaded", "not_offloaded"):  # no preemption
        for name in ("resume", "resume_recomputed_tokens", "resume_context_tokens"):
            assert f'lengthwise_{name}_total{{executor="sim0",kv="{kv}"}} 0.0' in text
    assert "# TYPE lengthwise_kvstore_bytes gauge" in text  # no kvstore: no samples
    assert "lengthwise_kvstore_bytes{" not in text


@pytest.mark.asyncio
async def test_config_info_names_the_live_config_and_follows_a_reload(
        client: tuple[httpx.AsyncClient, Service]) -> None:
    http, service = client
    before = service.config
    assert _config_info((await http.get("/metrics")).text) == \
        [(before.scheduler.policy, config_sha256(before))]
    after = msgspec.structs.replace(before, scheduler=msgspec.structs.replace(
        before.scheduler, policy="fcfs"))
    service.apply(after)  # what SIGHUP does with a file it accepts
    info = _config_info((await http.get("/metrics")).text)
    assert info == [("fcfs", config_sha256(after))] and config_sha256(after) != \
        config_sha256(before)


def _config_info(metrics: str) -> list[tuple[str, str]]:
    """(policy, config_sha256) of every lengthwise_config_info sample."""
    samples = re.findall(r"^lengthwise_config_info\{(.*)\} 1\.0$", metrics, re.MULTILINE)
    return [(re.findall(r'policy="([^"]+)"', labels)[0],
             re.findall(r'config_sha256="([0-9a-f]{64})"', labels)[0]) for labels in samples]


@pytest.mark.asyncio
@pytest.mark.parametrize("client", [PredictorConfig(timeout_s=1e-9, fallback_tokens=77.0)],
                         indirect=True)
async def test_a_late_prediction_gets_the_fallback(
        client: tuple[httpx.AsyncClient, Service]) -> None:
    http, service = client
    await service.start()
    response = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": HELLO,
                                                              "max_tokens": 3})
    assert response.status_code == 200
    assert response.headers["x-lengthwise-predicted-tokens"] == "77"
    assert "lengthwise_prediction_fallbacks_total 1.0" in (await http.get("/metrics")).text


@pytest.mark.asyncio
async def test_loop_lag_probe_sees_a_blocked_loop() -> None:
    import time

    from daemon.http.metrics import Metrics

    metrics = Metrics()
    probe = asyncio.create_task(metrics.watch_loop_lag())
    await asyncio.sleep(0.05)  # the probe's timer is armed
    time.sleep(0.4)  # noqa: ASYNC251 - the point: block the loop; its timer fires ~0.3 s late
    await asyncio.sleep(0.25)
    probe.cancel()
    text = metrics.render().decode()
    assert 'lengthwise_event_loop_lag_seconds_bucket{le="0.25"}' in text
    late = float(text.split('lengthwise_event_loop_lag_seconds_sum ')[1].split()[0])
    assert 0.25 < late < 1.0
