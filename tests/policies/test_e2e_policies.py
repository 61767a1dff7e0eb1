"""One end-to-end test per policy through the real daemon, the real vLLM engine and the
openai client. Needs a `policy_daemon` fixture (a factory: policy name -> a running
tests.support.DaemonProcess with max_running small enough that requests queue); skipped
where the fixture is not provided."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from policies import registry
from tests.support import DaemonProcess

pytestmark = pytest.mark.engine

PROMPTS = [f"Count from 1 to {n}, one number per line." for n in (3, 40, 8, 25, 5, 60)]
MAX_TOKENS = [24, 160, 48, 120, 32, 200]


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


@pytest.mark.parametrize("policy", registry.names())
def test_policy_serves_concurrent_streams_exactly_as_alone(request: pytest.FixtureRequest,
                                                           policy: str) -> None:
    """Greedy answers under contention (queueing, slices, preemptions) equal the answers
    each request gets alone, token for token, and every request completes."""
    daemon = _daemon(request, policy)
    client = openai.OpenAI(base_url=daemon.base_url + "/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    alone = [_ask(client, model, p, n) for p, n in zip(PROMPTS, MAX_TOKENS, strict=True)]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda pn: _ask(client, model, *pn),
                                 zip(PROMPTS, MAX_TOKENS, strict=True)))
    assert together == alone
    assert all(reason == "length" and text for text, reason in together)
    finished = daemon.metric("lengthwise_jobs_finished_total")
    assert finished >= 2 * len(PROMPTS)
