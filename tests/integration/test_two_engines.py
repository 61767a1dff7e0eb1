"""Two real vLLM engines in one daemon on this 2-core machine, one core each ("cpu:0",
"cpu:1"): they load while the event loop answers, both serve, and each request goes to
the engine with less predicted outstanding work."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.support import TINY, DaemonProcess, config_text, free_port

pytestmark = pytest.mark.engine

# No predictor and a fallback beyond any budget: a job's predicted remaining work is its
# remaining max_tokens, so the expected placement is exact.
_PREDICTED_AS_BUDGET = "[predictor]\npath = \"none\"\nfallback_tokens = 1000000.0\n"
_LONG = 4000  # output tokens of the long job: seconds, while the short ones take far less


@pytest.fixture(scope="module")
def two_engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess,
                                                                             float]]:
    """The daemon once ready, and the slowest /health answer seen while engines loaded."""
    folder = tmp_path_factory.mktemp("two-engines")
    path = folder / "lengthwise.toml"
    path.write_text(config_text(TINY, free_port(), max_running=2, max_num_seqs=4,
                                devices=("cpu:0", "cpu:1"), max_model_len=4096,
                                extra=_PREDICTED_AS_BUDGET))
    daemon = DaemonProcess(path, folder / "daemon.log")
    try:
        yield daemon, _slowest_health_while_starting(daemon, timeout_s=300)
    finally:
        assert daemon.stop() == 0, daemon.log()


def _slowest_health_while_starting(daemon: DaemonProcess, timeout_s: float) -> float:
    slowest, deadline = 0.0, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if daemon.proc.poll() is not None:
            raise RuntimeError(f"daemon exited:\n{daemon.log()}")
        start = time.monotonic()
        try:
            status = httpx.get(daemon.base_url + "/health", timeout=30).status_code
        except httpx.TransportError:  # not listening yet
            time.sleep(0.2)
            continue
        slowest = max(slowest, time.monotonic() - start)
        if status == 200:
            return slowest
        time.sleep(0.2)
    raise TimeoutError(daemon.log())


def test_engines_load_off_the_event_loop_on_their_own_cores(
        two_engines: tuple[DaemonProcess, float]) -> None:
    daemon, slowest_health_s = two_engines
    log = daemon.log()
    # Loading took tens of seconds; a loop blocked by a load would hold /health that long.
    # The bound leaves room for 2 busy cores (1.3 s seen while both engines loaded).
    loaded_s = float(log.split("lengthwise: ready in ", 1)[1].split()[0])
    assert loaded_s > 10 and slowest_health_s < 5.0, (loaded_s, slowest_health_s)
    assert "VLLM_CPU_OMP_THREADS_BIND='0'" in log and "VLLM_CPU_OMP_THREADS_BIND='1'" in log
    assert "executor cpu0-0 ready on cpu:0" in log and "executor cpu1-1 ready on cpu:1" in log


async def _complete(client: openai.AsyncOpenAI, max_tokens: int) -> int:
    done = await client.completions.create(model="tiny-llama", prompt="Once upon a time",
                                           max_tokens=max_tokens, temperature=0.0,
                                           extra_body={"ignore_eos": True})
    assert done.usage is not None
    return done.usage.completion_tokens


def _started(daemon: DaemonProcess) -> dict[str, float]:
    return {ex: daemon.metric("lengthwise_jobs_started_total", f'executor="{ex}"')
            for ex in ("cpu0-0", "cpu1-1")}


@pytest.mark.asyncio
async def test_both_serve_and_placement_follows_predicted_work(
        two_engines: tuple[DaemonProcess, float]) -> None:
    daemon, _ = two_engines
    before = _started(daemon)
    async with openai.AsyncOpenAI(base_url=daemon.base_url + "/v1", api_key="x") as client:
        long_job = asyncio.create_task(_complete(client, _LONG))
        async with asyncio.timeout(60):
            while sum(_started(daemon).values()) == sum(before.values()):
                await asyncio.sleep(0.02)
        busy = next(ex for ex, n in _started(daemon).items() if n > before[ex])
        # Both short jobs go where less predicted work is outstanding (each executor has
        # two slots): none beside the long one.
        shorts = await asyncio.gather(_complete(client, 30), _complete(client, 30))
        # Else the shorts were placed after it ended (a very slow client): not the test.
        assert not long_job.done(), "the long job ended before the short ones"
        assert await long_job == _LONG
    assert shorts == [30, 30]
    after = _started(daemon)
    idle = next(ex for ex in after if ex != busy)
    assert (after[busy] - before[busy], after[idle] - before[idle]) == (1, 2), (
        before, after, busy, daemon.log()[-3000:])
    for ex in after:
        assert daemon.metric("lengthwise_tokens_generated_total", f'executor="{ex}"') > 0
