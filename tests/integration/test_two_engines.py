"""Two real vLLM engines in one service on this 2-core machine, one core each ("cpu:0",
"cpu:1"), driven by the real scheduler in-process: they load concurrently while the event
loop keeps running, both serve, and each job goes to the engine with less predicted
outstanding work. In-process because, through HTTP, a client starved of CPU here may send
its next request only after the previous one ended, and then there is no placement left to
see (measured: /health answered after up to 9 s while an engine generated, on one engine
as on two)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psutil
import pytest
import pytest_asyncio

from daemon.config import Config, EngineConfig, ModelConfig, PredictorConfig, SchedulerConfig
from daemon.core.job import Job, SamplingSpec
from daemon.core.stream import JobEnd, OutputStream
from daemon.service import Service
from tests.support import TINY, read_to_end

pytestmark = pytest.mark.engine
_PROBE_S = 0.05  # period of the loop-lag probe while the engines load


def _engine_workers() -> dict[int, psutil.Process]:
    """The vLLM model workers this process started, by pid (not those of the session's daemon
    fixtures' `lengthwise serve` subprocesses, which have engines of their own)."""
    ours = [c for c in psutil.Process().children()
            if "lengthwise serve" not in " ".join(c.cmdline())]
    return {p.pid: p for c in ours for p in (c, *c.children(recursive=True))
            if "VLLM::Worker" in " ".join(p.cmdline())}


async def _max_loop_lag(stop: asyncio.Event) -> float:
    loop, worst = asyncio.get_running_loop(), 0.0
    while not stop.is_set():
        start = loop.time()
        await asyncio.sleep(_PROBE_S)
        worst = max(worst, loop.time() - start - _PROBE_S)
    return worst


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def two_engines() -> AsyncIterator[tuple[Service, float, float, list[psutil.Process]]]:
    """The started service, the event loop's worst lag while it started, how long starting
    took (seconds), and its engines' model workers (an engine of another test in this
    process, such as the session's SmolLM2 one, is not among them)."""
    config = Config(model=ModelConfig(path=str(TINY), max_model_len=4096),
                    engine=EngineConfig(devices=["cpu:0", "cpu:1"], max_num_seqs=4,
                                        vllm_args={"dtype": "float32"}),
                    scheduler=SchedulerConfig(max_running=2),
                    predictor=PredictorConfig(path="none"))
    before = _engine_workers()
    service = await Service.create(config)
    loop, stop = asyncio.get_running_loop(), asyncio.Event()
    probe = asyncio.create_task(_max_loop_lag(stop))
    started = loop.time()
    await service.start()
    took = loop.time() - started
    stop.set()
    workers = [p for pid, p in _engine_workers().items() if pid not in before]
    yield service, await probe, took, workers
    await service.scheduler.abort_all(timeout_s=10)
    await service.shutdown()


def _job(service: Service, max_tokens: int) -> Job:
    job = service.new_job(list(range(100, 120)), SamplingSpec(max_tokens=max_tokens,
                                                              temperature=0.0,
                                                              ignore_eos=True), 0, "two")
    job.predicted_output_tokens = float(max_tokens)  # predicted work = its budget
    return job


async def _finish(stream: OutputStream) -> JobEnd:
    return (await read_to_end(stream))[1]


@pytest.mark.asyncio(loop_scope="module")
async def test_engines_load_concurrently_off_the_event_loop_on_their_cores(
        two_engines: tuple[Service, float, float, list[psutil.Process]]) -> None:
    service, worst_lag_s, took_s, workers = two_engines
    # Loading took tens of seconds; built on the loop, it would have stalled it that long.
    # The loop's worst lag is held to a tenth of that, not to a fixed second: on a machine
    # shared with another test worker a starved probe measured 1.04 s in a 38.6 s load.
    assert took_s > 5 and worst_lag_s < 0.1 * took_s, (took_s, worst_lag_s)
    assert [ex.name for ex in service.executors] == ["cpu0-0", "cpu1-1"]
    # Each engine inherited its own binding although both were built at once: its model
    # worker runs on its core only.
    assert sorted(p.cpu_affinity() for p in workers) == [[0], [1]]


@pytest.mark.asyncio(loop_scope="module")
async def test_both_serve_and_placement_follows_predicted_work(
        two_engines: tuple[Service, float, float, list[psutil.Process]]) -> None:
    service, _, _, _ = two_engines
    scheduler = service.scheduler
    long_job = _job(service, 3000)
    long_stream = service.submit(long_job)
    async with asyncio.timeout(60):
        while long_job.num_generated_tokens == 0:
            await asyncio.sleep(0.01)
    shorts = [_job(service, 30), _job(service, 30)]
    # placed in one round, while the long job holds ~3000 tokens of work
    streams = [service.submit(job) for job in shorts]
    ends = await asyncio.gather(*(_finish(stream) for stream in streams))
    assert [end.finish_reason for end in ends] == ["length", "length"]
    assert [job.num_generated_tokens for job in shorts] == [30, 30]
    other = next(ex.name for ex in service.executors if ex.name != long_job.executor_name)
    assert [job.executor_name for job in shorts] == [other, other]
    scheduler.cancel(long_job.job_id)  # its placement is shown; no need for 3000 tokens
    await _finish(long_stream)
    assert long_job.num_generated_tokens > 0
    assert all(lane.stats.tokens_generated > 0 for lane in scheduler.lanes)
