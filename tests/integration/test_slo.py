"""Latency objectives on the real engine (vLLM, tiny model, one slot): a request with an
objective goes ahead of best-effort work that came first; once admission has seen its
forecasts' errors, one that cannot make its TTFT gets 429 with Retry-After at once; a
sheddable request gives its room to a more urgent one; and /metrics counts what the client
saw. On the session's policy daemon (tests/conftest.py), reloaded to fcfs with one running
job, three waiting and a sheddable class, then back."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import httpx
import pytest

from daemon.core.promises import MIN_ERRORS
from daemon.http.slo import DROPPED_HEADER, TPOT_HEADER, TTFT_HEADER
from tests.support import DaemonProcess

pytestmark = pytest.mark.engine

# refuse_after_late = 0: the scenario is the refusal itself, on the first forecast that misses
# (not only once a waiting job turned late, the default).
CLASSES = '\n[slo]\nclasses = { "5" = { sheddable = true } }\nrefuse_after_late = 0\n'
OUTCOMES = ("met", "missed", "refused", "shed")


def _ask(tokens: int, priority: int = 0, text: str = "hello") -> dict[str, object]:
    return {"model": "tiny-llama", "messages": [{"role": "user", "content": text}],
            "max_tokens": tokens, "ignore_eos": True, "temperature": 0.0, "priority": priority}


async def _wait_for(daemon: DaemonProcess, name: str, value: float, **labels: str) -> None:
    deadline = time.monotonic() + 60
    while await asyncio.to_thread(daemon.metric, name, **labels) < value:
        assert time.monotonic() < deadline, f"{name}{labels} never reached {value}"
        await asyncio.sleep(0.05)


def _one_slot(config: str) -> str:
    """The policy daemon's config with fcfs, one running job, three waiting, a sheddable
    class (the engine keeps its 4 seqs: with a fixed max_running it gets no spare job)."""
    for old, new in [("max_running = 2", "max_running = 1"),
                     ("max_waiting = 1024", "max_waiting = 3")]:
        assert old in config
        config = config.replace(old, new)
    return config + CLASSES


@pytest.mark.asyncio
async def test_objectives_on_the_real_engine(policy_daemon: Callable[[str], DaemonProcess]
                                             ) -> None:
    daemon = policy_daemon("fcfs")
    shared = daemon.config_path.read_text()
    daemon.reload(_one_slot(shared))
    try:
        async with httpx.AsyncClient(base_url=daemon.base_url, timeout=120) as http:
            await _learn_forecasts(http)
            before = {outcome: daemon.metric("lengthwise_slo_requests_total", outcome=outcome)
                      for outcome in OUTCOMES}
            await _scenario(daemon, http, before)
    finally:
        daemon.reload(shared)


async def _learn_forecasts(http: httpx.AsyncClient) -> None:
    """Admission refuses only on a forecast whose error it has seen: rounds of three short
    requests with a loose objective (one starts, two queue behind it with a promised start;
    max_waiting is 3) give it MIN_ERRORS starts to learn from."""
    for _ in range(MIN_ERRORS // 2 + 1):
        answers = await asyncio.gather(*(http.post(
            "/v1/chat/completions", json=_ask(8), headers={TTFT_HEADER: "120000"})
            for _ in range(3)))
        assert all(a.status_code == 200 for a in answers), [a.text for a in answers]


async def _scenario(daemon: DaemonProcess, http: httpx.AsyncClient,
                    before: dict[str, float]) -> None:
    done: list[str] = []

    async def post(name: str, body: dict[str, object], **headers: str) -> httpx.Response:
        response = await http.post("/v1/chat/completions", json=body, headers=headers)
        done.append(name)
        return response

    # One long job holds the only slot for seconds.
    blocker = asyncio.create_task(post("blocker", _ask(1500, text="write a long story")))
    await _wait_for(daemon, "lengthwise_running_jobs", 1)
    waiting = await asyncio.to_thread(daemon.metric, "lengthwise_predicted_ttft_seconds")
    assert waiting > 0.1  # the precondition of the refusal below: the blocker is predicted long
    margin = await asyncio.to_thread(daemon.metric, "lengthwise_slo_admission_margin_ratio",
                                     forecast="queue")  # real / forecast waits, learned

    # A request whose TTFT objective is a third of the predicted wait (as the starts so far
    # went): refused at once, before it becomes a job (no engine work), with when to retry
    # and llm-d's reason.
    started = time.perf_counter()
    objective = f"{waiting * margin * 1000 / 3:.0f}"
    refused = await post("refused", _ask(8), **{TTFT_HEADER: objective})
    assert refused.status_code == 429, refused.text
    assert time.perf_counter() - started < 1.0
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.headers[DROPPED_HEADER] == "rejected-saturated"
    assert refused.json()["error"]["code"] == "slo_unreachable"

    # Best effort first, then a request with a reachable objective: it goes first.
    best_effort = asyncio.create_task(post("best-effort", _ask(8)))
    await _wait_for(daemon, "lengthwise_queue_depth", 1)
    on_time = asyncio.create_task(post("on-time", _ask(8), **{TTFT_HEADER: "120000"}))
    await _wait_for(daemon, "lengthwise_queue_depth", 2)
    sheddable = asyncio.create_task(post("sheddable", _ask(8, priority=5)))
    await _wait_for(daemon, "lengthwise_queue_depth", 3)  # the queue is full (max_waiting)
    # Equal work is not dropped for equal work; a more urgent request makes room.
    equal = await post("equal", _ask(8, priority=5))
    assert equal.status_code == 429 and "requests are already waiting" in equal.text
    urgent = asyncio.create_task(post("urgent", _ask(8, priority=0)))
    dropped = await sheddable
    assert dropped.status_code == 429, dropped.text
    assert dropped.headers[DROPPED_HEADER] == "evicted-priority"

    # The blocker has held the slot long enough: its client leaves (the slot frees at once
    # instead of after 1,500 tokens), and the queue runs in its order.
    blocker.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await blocker
    responses = await asyncio.gather(best_effort, on_time, urgent)
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    assert done.index("on-time") < done.index("best-effort") < done.index("urgent")
    headers = responses[1].headers
    assert int(headers["x-lengthwise-predicted-ttft-ms"]) <= int(
        headers["x-lengthwise-predicted-finish-ms"])

    # What the client saw, counted in /metrics.
    counts = {outcome: await asyncio.to_thread(
        daemon.metric, "lengthwise_slo_requests_total", outcome=outcome) - before[outcome]
        for outcome in OUTCOMES}
    assert counts == {"met": 1, "missed": 0, "refused": 1, "shed": 1}


@pytest.mark.asyncio
async def test_a_trickle_with_objectives_starts_at_once_and_is_never_refused(
        policy_daemon: Callable[[str], DaemonProcess]) -> None:
    """Light load (issue 39): requests with objectives that arrive one after another each
    start within a decision round of being queued, and none is refused."""
    daemon = policy_daemon("ssjf")

    def queue_phase() -> tuple[float, float]:
        return (daemon.metric("lengthwise_ttft_phase_seconds_sum", phase="queue"),
                daemon.metric("lengthwise_ttft_phase_seconds_count", phase="queue"))

    (waited, started), refused = queue_phase(), daemon.metric(
        "lengthwise_slo_requests_total", outcome="refused")
    async with httpx.AsyncClient(base_url=daemon.base_url, timeout=120) as http:
        for i in range(5):
            response = await http.post("/v1/chat/completions", json=_ask(16, text=f"hi {i}"),
                                       headers={TTFT_HEADER: "1000",
                                                TPOT_HEADER: "50"})
            assert response.status_code == 200, response.text
            await asyncio.sleep(0.05)
    now_waited, now_started = queue_phase()
    assert now_started - started == 5
    assert (now_waited - waited) / 5 < 0.05  # no wait beyond a decision round
    assert daemon.metric("lengthwise_slo_requests_total", outcome="refused") == refused
