"""Router-facing metrics in-process, on two simulated executors, read the way a router does:
parsed with a Prometheus text parser, first matching series of each family."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import msgspec
import pytest
import pytest_asyncio
from prometheus_client.samples import Sample

from bench import promtext
from daemon.config import Config, EngineConfig, ModelConfig, SchedulerConfig
from daemon.core.job import Job, SamplingSpec
from daemon.http.app import build_app
from daemon.http.routermetrics import RouterCollector
from daemon.service import Service

ROUTER_GAUGES = ("vllm:num_requests_waiting", "vllm:num_requests_running",
                 "vllm:kv_cache_usage_perc", "vllm:cache_config_info")


def first(families: dict[str, list[Sample]], name: str, **labels: str) -> Sample:
    """The series the EPP reads: the first one whose labels match."""
    return next(s for s in families[name] if labels.items() <= s.labels.items())


def _config(model: Path, policy: str) -> Config:
    return Config(model=ModelConfig(path=str(model), max_model_len=2048),
                  engine=EngineConfig(kind="sim", devices=["cpu", "cpu"], max_num_seqs=1),
                  scheduler=SchedulerConfig(policy=policy, max_running=1, max_waiting=16))


@pytest_asyncio.fixture
async def service(smollm2_model: Path) -> AsyncIterator[Service]:
    service = await Service.create(_config(smollm2_model, "ssjf"))
    await service.start()
    yield service
    await service.scheduler.abort_all(timeout_s=5)
    await service.shutdown()


def _job(service: Service, predicted: float, prompt_tokens: int = 64) -> Job:
    job = service.new_job(list(range(1, prompt_tokens + 1)),
                          SamplingSpec(max_tokens=1000, ignore_eos=True), 0, "t")
    job.predicted_output_tokens = predicted
    return job


async def _until(condition: object, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.005)


@pytest.mark.asyncio
async def test_router_gauges_track_a_backlog(service: Service) -> None:
    app = build_app(service)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://test") as http:
        idle = promtext.families((await http.get("/metrics")).text)
        assert first(idle, "vllm:num_requests_waiting").value == 0
        assert first(idle, "vllm:num_requests_running").value == 0
        assert first(idle, "vllm:kv_cache_usage_perc").value == 0
        for _ in range(5):
            service.submit(_job(service, 500))
        await _until(lambda: all(ex.engine_stats().num_running_reqs == 1
                                 for ex in service.executors))
        busy = promtext.families((await http.get("/metrics")).text)
    for name in ROUTER_GAUGES:
        sample = first(busy, name)
        assert sample.labels["model_name"] == "smollm2-135m-instruct", name
    assert first(busy, "vllm:num_requests_waiting").value == 3
    assert first(busy, "vllm:num_requests_running").value == 2
    assert 0 < first(busy, "vllm:kv_cache_usage_perc").value <= 1
    info = first(busy, "vllm:cache_config_info")
    assert info.labels["block_size"] == "16" and info.labels["num_gpu_blocks"] == "16384"
    outstanding = {s.labels["executor"]: s.value
                   for s in busy["lengthwise_predicted_outstanding_tokens"]}
    assert busy["lengthwise_predicted_outstanding_tokens"][0].labels["executor"] == "total"
    assert outstanding["waiting"] == 3 * 500
    assert 0 < outstanding["sim0"] <= 500 and 0 < outstanding["sim1"] <= 500
    assert outstanding["total"] == pytest.approx(sum(v for k, v in outstanding.items()
                                                     if k != "total"))
    assert first(busy, "lengthwise_estimated_wait_seconds").value > 0


@pytest.mark.asyncio
async def test_estimated_wait_follows_the_policy_order(service: Service) -> None:
    collector = RouterCollector(service)
    for predicted in (400, 400, 900, 900, 900):
        service.submit(_job(service, predicted))
    await _until(lambda: service.scheduler.num_running == 2)
    assert collector.median_job() == (256, service.predictions.fallback_tokens)
    # ssjf: a median (256-token) job goes before the three 900-token ones.
    per_token = collector.seconds_per_token()
    sjf_wait = collector.estimated_wait_s()
    def running() -> float:  # the running jobs' rest, as they decode (no await inside)
        return sum(job.predicted_remaining_tokens for lane in service.scheduler.lanes
                   for job in lane.running.values())

    assert sjf_wait == pytest.approx(running() * per_token / 2)
    # fcfs: all three are ahead of a new arrival.
    fcfs = msgspec.structs.replace(service.config, scheduler=msgspec.structs.replace(
        service.config.scheduler, policy="fcfs"))
    service.apply(fcfs)  # takes effect in the core's loop, in order with other events
    await _until(lambda: service.scheduler.policy.name == "fcfs")
    # (read with the running jobs' rest of the same instant: they decoded meanwhile)
    fcfs_wait, rest = collector.estimated_wait_s(), running()
    assert fcfs_wait == pytest.approx(rest * per_token / 2 + 3 * 900 * per_token / 2)


@pytest.mark.asyncio
async def test_no_wait_while_a_slot_is_free(service: Service) -> None:
    collector = RouterCollector(service)
    service.submit(_job(service, 300))
    await _until(lambda: service.scheduler.num_running == 1)
    assert collector.estimated_wait_s() == 0.0


@pytest.mark.asyncio
async def test_outstanding_tokens_per_executor_is_the_placements_running_total(
        service: Service) -> None:
    """The metric sums the running jobs at scrape time; placement reads each executor's
    running total (daemon.core.work). With every job predicted they are the same number."""
    collector = RouterCollector(service)
    for predicted in (300.5, 700.25, 50.0):
        service.submit(_job(service, predicted))
    await _until(lambda: service.scheduler.num_running == 2)
    await asyncio.sleep(0.05)  # some tokens streamed: the totals moved
    family = collector._outstanding()  # no await between this and the totals below
    by_name = {s.labels["executor"]: s.value for s in family.samples}
    lanes = service.scheduler.lanes
    assert sum(lane.load() for lane in lanes) > 0
    for lane in lanes:
        assert by_name[lane.name] == pytest.approx(lane.load(), abs=1e-6)


@pytest.mark.asyncio
async def test_the_learned_clock_admission_and_engine_preemptions_are_exported(
        service: Service) -> None:
    app = build_app(service)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://test") as http:
        for _ in range(4):
            service.submit(_job(service, 60))
        lanes = service.scheduler.lanes
        await _until(lambda: all(lane.clock.fits for lane in lanes))
        text = (await http.get("/metrics")).text
    families = promtext.families(text)
    preemptions = first(families, "vllm:num_preemptions")  # vLLM's name and meaning
    assert preemptions.name == "vllm:num_preemptions_total" and preemptions.value == 0
    assert preemptions.labels["engine"] == "all"
    base = first(families, "lengthwise_step_coefficient_seconds", executor="sim0",
                 term="decode_base_s").value
    # The simulated engine's 8 ms, as the loop runs it in real time (its own work on top).
    assert base == pytest.approx(0.008, rel=0.25)
    step = first(families, "lengthwise_predicted_decode_step_seconds", executor="sim0").value
    assert step == pytest.approx(lanes[0].clock.decode_step_s(
        max(len(lanes[0].running), 1),
        sum(j.num_prompt_tokens + j.num_generated_tokens for j in lanes[0].running.values())))
    assert first(families, "lengthwise_step_samples", executor="sim0").value >= 8
    assert first(families, "lengthwise_kv_blocks", executor="sim1").value == 8192
    assert first(families, "lengthwise_engine_preemptions", executor="sim0").value == 0
