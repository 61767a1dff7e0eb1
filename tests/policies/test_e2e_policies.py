"""One end-to-end test per policy through the real daemon, the real vLLM engine and the
openai client. Needs a `policy_daemon` fixture (a factory: policy name -> a running
tests.support.DaemonProcess with max_running small enough that requests queue); skipped
where the fixture is not provided."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from policies import registry
from tests.support import DaemonProcess, openai_client

pytestmark = pytest.mark.engine

PROMPTS = [f"Count from 1 to {n}, one number per line." for n in (3, 40, 8, 25, 5, 60)]
MAX_TOKENS = [16, 140, 32, 64, 20, 150]  # two past scls's 128-token slice


def _daemon(request: pytest.FixtureRequest, policy: str) -> DaemonProcess:
    try:
        factory: Callable[[str], DaemonProcess] = request.getfixturevalue("policy_daemon")
    except pytest.FixtureLookupError:
        pytest.skip("needs the policy_daemon fixture (policy name -> running daemon)")
    return factory(policy)


def _ask(client: openai.OpenAI, model: str, prompt: str, max_tokens: int) -> tuple[str, str]:
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
        temperature=0.0, stream=True, extra_body={"ignore_eos": True})
    text, reason = [], ""
    for chunk in stream:
        if chunk.choices:
            text.append(chunk.choices[0].delta.content or "")
            reason = chunk.choices[0].finish_reason or reason
    return "".join(text), reason


@pytest.fixture(scope="module")
def alone(request: pytest.FixtureRequest) -> list[tuple[str, str]]:
    """Each request's answer when it runs alone: one at a time, no policy has a choice, so
    one pass (under fcfs) serves every policy's comparison."""
    with openai_client(_daemon(request, "fcfs")) as client:
        model = client.models.list().data[0].id
        return [_ask(client, model, p, n) for p, n in zip(PROMPTS, MAX_TOKENS, strict=True)]


# The oracles (benchmarks only) schedule as their parents do (ssjf, isrtf, blend) with the
# true lengths a benchmark sends; tests/bench/test_sweep.py serves one end to end.
@pytest.mark.parametrize("policy", [name for name in registry.names()
                                    if not registry.benchmark_only(name)])
def test_policy_serves_concurrent_streams_exactly_as_alone(
        request: pytest.FixtureRequest, alone: list[tuple[str, str]], policy: str) -> None:
    """Greedy answers under contention (queueing, slices, preemptions) equal the answers
    each request gets alone, token for token, and every request completes."""
    with openai_client(_daemon(request, policy)) as client, \
            ThreadPoolExecutor(len(PROMPTS)) as pool:
        model = client.models.list().data[0].id
        together = list(pool.map(lambda pn: _ask(client, model, *pn),
                                 zip(PROMPTS, MAX_TOKENS, strict=True)))
    assert together == alone
    assert all(reason == "length" and text for text, reason in together)


def _timed(base_url: str, model: str, prompt: str, max_tokens: int,
           started: threading.Event | None = None) -> tuple[float, float, float]:
    """(predicted tokens from the header, first-token time, last-token time), monotonic."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0.0, "stream": True, "ignore_eos": True}
    first = None
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body,
                      timeout=120.0) as response:
        assert response.status_code == 200
        predicted = float(response.headers["x-lengthwise-predicted-tokens"])
        for line in response.iter_lines():
            if first is None and '"content"' in line:
                first = time.monotonic()
                if started is not None:
                    started.set()
    assert first is not None
    return predicted, first, time.monotonic()


def test_ssjf_runs_a_backlog_in_predicted_order_and_a_late_short_job_first(
        request: pytest.FixtureRequest) -> None:
    """Two long jobs hold both slots; a backlog queues behind them, the shortest (a 6-token
    budget caps its prediction) last. ssjf starts the backlog in predicted order (the
    prediction capped by each budget), and the late short job finishes first."""
    daemon = _daemon(request, "ssjf")
    model = httpx.get(daemon.base_url + "/v1/models").json()["data"][0]["id"]
    budgets = [120, 80, 40, 6]  # arrival order: the short job comes last
    backlog = [f"Write a story about a {w}." for w in ("castle", "dragon", "river", "cat")]
    with ThreadPoolExecutor(len(budgets) + 2) as pool:
        held = [threading.Event() for _ in range(2)]
        blockers = [pool.submit(_timed, daemon.base_url, model, f"Count to {n}.", 400, ev)
                    for n, ev in zip((500, 600), held, strict=True)]
        assert all(ev.wait(60) for ev in held)
        queued = []
        for prompt, budget in zip(backlog, budgets, strict=True):
            queued.append(pool.submit(_timed, daemon.base_url, model, prompt, budget))
            time.sleep(0.02)  # a definite arrival order
        results = [f.result() for f in queued]
        freed = min(f.result()[2] for f in blockers)
    assert all(first > freed - 0.05 for _, first, _ in results), "a slot was free too early"
    keys = [min(pred, budget) for (pred, _, _), budget in zip(results, budgets, strict=True)]
    by_key = sorted(range(len(keys)), key=keys.__getitem__)
    starts = [first for _, first, _ in results]
    # Two slots: the two smallest keys start before either of the two largest.
    assert max(starts[i] for i in by_key[:2]) < min(starts[i] for i in by_key[2:]), keys
    ends = [last for _, _, last in results]
    assert min(range(len(ends)), key=ends.__getitem__) == len(budgets) - 1
