"""Latency objectives over HTTP, in-process (ASGI, simulated executor): headers checked, a
request that cannot meet its TTFT refused at once with Retry-After and llm-d's reason, a
sheddable class giving its room to a more urgent one (never to equal work), the predicted
latency in the response headers, attainment and refusals in /metrics."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import msgspec
import pytest
import pytest_asyncio
from starlette.datastructures import Headers

from daemon.apikeys import ApiKey, Objective
from daemon.config import Config, EngineConfig, ModelConfig, SchedulerConfig, SloConfig
from daemon.core import slo
from daemon.core.job import Job, SamplingSpec, Slo
from daemon.http.app import build_app
from daemon.http.errors import ApiError
from daemon.http.slo import ALIASES, DROPPED_HEADER, TPOT_HEADER, TTFT_HEADER, objective
from daemon.service import Service
from tests.support import learn_forecast_errors

MODEL = "smollm2-135m-instruct"
ASK = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
CLASSES = {"5": Objective(sheddable=True), "1": Objective(ttft_ms=30_000, tpot_ms=1_000)}


@pytest_asyncio.fixture
async def rig(smollm2_model: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Service]]:
    config = Config(model=ModelConfig(path=str(smollm2_model), max_model_len=512),
                    engine=EngineConfig(kind="sim", max_num_seqs=1),
                    scheduler=SchedulerConfig(policy="fcfs", max_running=1, max_waiting=2),
                    slo=SloConfig(classes=CLASSES))
    service = await Service.create(config)
    await service.start()
    transport = httpx.ASGITransport(app=build_app(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        yield http, service
    await service.scheduler.abort_all(timeout_s=5)
    await service.shutdown()


async def _occupy(service: Service, priority: int = 0, count: int = 1) -> None:
    """Jobs that last seconds on the simulated engine (8 ms a step x 400 tokens); admission
    has seen its forecasts come true and enough waiting jobs turn late (it refuses only on a
    forecast whose error it knows, and only in overload: [slo] refuse_after_late)."""
    for _ in range(count):
        job = service.new_job([1, 2], SamplingSpec(max_tokens=400, ignore_eos=True), priority,
                              "fill", slo=Slo(sheddable=True) if priority == 5 else None)
        service.submit(job)
        await asyncio.sleep(0.05)
    forecast = service.scheduler.forecast
    learn_forecast_errors(forecast)
    for k in range(forecast.overload.after_late):
        forecast.turned_late(f"late-{k}", forecast.now())


def test_headers_win_over_the_key_and_the_class() -> None:
    key = ApiKey("k", objective=Objective(ttft_ms=500, sheddable=True))
    got = objective({TPOT_HEADER: "40"}, 1, key, CLASSES)
    assert got == Slo(ttft_s=0.5, tpot_s=0.04, sheddable=True)
    assert objective({}, 1, None, CLASSES) == Slo(ttft_s=30.0, tpot_s=1.0)
    assert objective({TTFT_HEADER: "250"}, 0, None, CLASSES) == Slo(ttft_s=0.25)
    assert objective({}, 0, None, CLASSES) is None  # best effort
    assert objective({}, 5, None, CLASSES) == Slo(sheddable=True)


@pytest.mark.parametrize("value", ["-5", "0", "abc", "nan", "inf", "1e9", "", "1_000", "+5",
                                   "\xa0250", "250\xa0", "1e3", "0x10", "250,300", "２５０",
                                   "250.", ".5"])
def test_a_bad_header_is_a_400_naming_it(value: str) -> None:
    with pytest.raises(ApiError) as caught:
        objective({TTFT_HEADER: value}, 0, None, {})
    assert caught.value.status == 400 and caught.value.info.param == TTFT_HEADER


@pytest.mark.parametrize("value", ["250", " 250\t", "250.0", "0.5"])
def test_a_header_is_milliseconds_in_digits(value: str) -> None:
    assert objective({TTFT_HEADER: value}, 0, None, {}) == Slo(ttft_s=float(value) / 1000)


def test_llm_ds_deprecated_aliases_count_unless_the_new_name_comes() -> None:
    old_ttft, old_tpot = ALIASES[TTFT_HEADER], ALIASES[TPOT_HEADER]
    assert objective({old_ttft: "250", old_tpot: "40"}, 0, None, {}) == \
        Slo(ttft_s=0.25, tpot_s=0.04)
    # the new name wins; the alias is then not read at all (llm-d: GetLowerCaseHeaderValue)
    assert objective({TTFT_HEADER: "100", old_ttft: "soon"}, 0, None, {}) == Slo(ttft_s=0.1)
    with pytest.raises(ApiError) as caught:
        objective({old_tpot: "soon"}, 0, None, {})
    assert caught.value.info.param == old_tpot


def test_a_header_sent_twice_with_different_values_is_a_400() -> None:
    twice = Headers(raw=[(TTFT_HEADER.encode(), b"100"), (TTFT_HEADER.encode(), b"200")])
    with pytest.raises(ApiError) as caught:
        objective(twice, 0, None, {})
    assert caught.value.status == 400 and caught.value.info.param == TTFT_HEADER
    assert "different values" in caught.value.info.message
    same = Headers(raw=[(TTFT_HEADER.encode(), b"100"), (TTFT_HEADER.encode(), b"100 ")])
    assert objective(same, 0, None, {}) == Slo(ttft_s=0.1)


@pytest.mark.asyncio
async def test_bad_header_over_http_and_the_daemon_keeps_serving(
        rig: tuple[httpx.AsyncClient, Service]) -> None:
    http, _ = rig
    bad = await http.post("/v1/chat/completions", json=ASK, headers={TPOT_HEADER: "soon"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == TPOT_HEADER
    twice = await http.post("/v1/chat/completions", json=ASK,
                            headers=[(TTFT_HEADER, "60000"), (TTFT_HEADER, "100")])
    assert twice.status_code == 400 and twice.json()["error"]["param"] == TTFT_HEADER
    good = await http.post("/v1/chat/completions", json=ASK, headers={TTFT_HEADER: "60000"})
    assert good.status_code == 200
    assert int(good.headers["x-lengthwise-predicted-ttft-ms"]) >= 0
    assert int(good.headers["x-lengthwise-predicted-finish-ms"]) >= int(
        good.headers["x-lengthwise-predicted-ttft-ms"])
    metrics = (await http.get("/metrics")).text
    assert 'lengthwise_slo_requests_total{outcome="met",priority="0"} 1.0' in metrics
    assert 'lengthwise_predicted_ttft_seconds{executor="sim0"}' in metrics
    for kind in ("queue", "memory"):  # cold: no start yet, the forecast as it is
        assert f'lengthwise_slo_admission_margin_ratio{{forecast="{kind}"}} 1.0' in metrics
    assert "lengthwise_slo_overloaded 0.0" in metrics  # nothing late: no forecast refuses


@pytest.mark.asyncio
async def test_unreachable_ttft_is_refused_at_once_before_any_engine_work(
        rig: tuple[httpx.AsyncClient, Service]) -> None:
    http, service = rig
    await _occupy(service, count=2)
    jobs = service.scheduler.num_jobs
    started = time.perf_counter()
    refused = await http.post("/v1/chat/completions", json=ASK, headers={TTFT_HEADER: "50"})
    elapsed = time.perf_counter() - started
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "slo_unreachable"
    # the forecast it was refused on: the running job's end (the waiting one is best effort,
    # behind it), x the margin learned
    assert re.search(r"predicted time to first token \d+ ms \(queue forecast: a wait of "
                     r"\d+ ms behind 0 jobs, x margin 1\.00\)",
                     refused.json()["error"]["message"])
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.headers[DROPPED_HEADER] == "rejected-saturated"
    assert service.scheduler.num_jobs == jobs  # never became a job
    assert elapsed < 1.0  # no waiting on the engine (the target, 50 ms, is benchmarked)
    metrics = (await http.get("/metrics")).text
    assert 'lengthwise_slo_requests_total{outcome="refused",priority="0"} 1.0' in metrics
    # by the forecast that refused it: the work ahead (two long jobs on the one slot)
    assert 'lengthwise_slo_refusals_total{cause="ttft:queue",priority="0"} 1.0' in metrics
    assert "lengthwise_slo_overloaded 1.0" in metrics  # a job turned late (_occupy)


@pytest.mark.asyncio
async def test_a_refusal_does_not_wait_for_the_prompt_to_be_tokenized(
        rig: tuple[httpx.AsyncClient, Service], monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait ahead of a request does not depend on its prompt: one that cannot make its
    TTFT even with an empty prompt is refused before tokenizing (which runs in a thread and
    waits its turn under load); one that can is tokenized and admitted as usual."""
    http, service = rig
    encoded: list[int] = []
    render_chat = service.tokenizer.render_chat  # the chat prompt's first step
    monkeypatch.setattr(service.tokenizer, "render_chat",
                        lambda *a, **k: encoded.append(1) or render_chat(*a, **k))
    await _occupy(service, count=2)
    refused = await http.post("/v1/chat/completions", json=ASK, headers={TTFT_HEADER: "50"})
    assert refused.status_code == 429 and encoded == []
    served = await http.post("/v1/chat/completions", json=ASK,
                             headers={TTFT_HEADER: "600000"})
    assert served.status_code == 200 and encoded == [1]


@pytest.mark.asyncio
async def test_a_sheddable_class_gives_its_room_to_a_more_urgent_request_only(
        rig: tuple[httpx.AsyncClient, Service]) -> None:
    http, service = rig
    await _occupy(service)  # running
    await _occupy(service, priority=5, count=2)  # waiting: the queue (2) is full
    # Equal work is never dropped for equal work: another sheddable request gets 429.
    same = await http.post("/v1/chat/completions", json={**ASK, "priority": 5})
    assert same.status_code == 429 and DROPPED_HEADER in same.headers
    assert service.scheduler.num_jobs == 3
    shed_before = [j for j in service.scheduler.waiting if j.priority == 5]
    urgent = asyncio.create_task(http.post("/v1/chat/completions", json=ASK))
    for _ in range(100):  # the urgent one is queued, one sheddable job dropped for it
        await asyncio.sleep(0.02)
        if sum(j.priority == 0 for j in service.scheduler.waiting) == 1:
            break
    left = [j for j in service.scheduler.waiting if j.priority == 5]
    assert len(left) == 1 and left[0] is shed_before[0]  # the latest-queued one went
    dropped = shed_before[1]
    assert dropped.finish_reason == "shed"
    await service.scheduler.abort_all(timeout_s=5)
    urgent.cancel()
    metrics = (await http.get("/metrics")).text
    assert 'lengthwise_slo_requests_total{outcome="shed",priority="5"} 1.0' in metrics


@pytest.mark.asyncio
async def test_shadow_mode_serves_what_it_would_refuse_and_counts_how_it_went(
        rig: tuple[httpx.AsyncClient, Service], caplog: pytest.LogCaptureFixture) -> None:
    """[slo] enforce = false (applied as a reload would): the request the test above refuses
    is served, and /metrics counts it as a would-be refusal that missed its objective (a
    right refusal); nothing is counted refused. The log says what it would have been
    refused on and how it went."""
    http, service = rig
    service.apply(msgspec.structs.replace(
        service.config, slo=SloConfig(classes=CLASSES, enforce=False)))
    await _occupy(service, count=1)
    with caplog.at_level(logging.INFO, logger="daemon.http.slometrics"):
        served = await http.post("/v1/chat/completions", json=ASK,
                                 headers={TTFT_HEADER: "50"})
        assert served.status_code == 200, served.text
        metrics = (await http.get("/metrics")).text
    assert re.search(r"would have been refused \(predicted time to first token \d+ ms "
                     r"\(queue forecast: a wait of \d+ ms behind 0 jobs, x margin 1\.00\)\); "
                     r"first token after \d+ ms, missed", caplog.text), caplog.text
    assert ('lengthwise_slo_shadow_refusals_total{cause="ttft:queue",outcome="missed",'
            'priority="0"} 1.0' in metrics), metrics
    # predicted seconds against a 50 ms objective: over 5x, above the top bucket
    assert 'lengthwise_slo_shadow_overshoot_count{outcome="missed"} 1.0' in metrics
    assert 'lengthwise_slo_shadow_overshoot_bucket{le="5.0",outcome="missed"} 0.0' in metrics
    assert 'outcome="refused"' not in metrics


@pytest.mark.asyncio
async def test_the_slo_sections_admission_knobs_reach_the_core_on_reload(
        rig: tuple[httpx.AsyncClient, Service]) -> None:
    """[slo] refuse_overshoot, late, refuse_after_late, refuse_inflow and promote_slack
    (benchmark knobs), applied as a reload would: the forecast and the waiting set take
    them, and a job already waiting is promoted under the new slack."""
    _, service = rig
    forecast, waiting = service.scheduler.forecast, service.scheduler.forecast.waiting
    assert (forecast.refuse_overshoot, waiting.late_in_place) == (1.0, True)
    assert forecast.promote_slack == slo.PROMOTE_SLACK
    job = Job("waits", [1, 2, 3], SamplingSpec(max_tokens=8), arrival_time=100.0,
              predicted_output_tokens=8, slo=Slo(ttft_s=1.0))
    waiting.push(job)
    before = waiting.promotion_due()
    service.apply(msgspec.structs.replace(service.config, slo=SloConfig(
        classes=CLASSES, refuse_overshoot=1.25, late="behind", refuse_after_late=3,
        refuse_inflow=1.5, promote_slack=0.75)))
    assert forecast.refuse_overshoot == 1.25 and not waiting.late_in_place
    assert forecast.overload.after_late == 3 and forecast.promote_slack == 0.75
    assert forecast.overload.inflow == 1.5
    assert before is not None and waiting.promotion_due() == pytest.approx(before - 0.5)
    waiting.remove(job)
