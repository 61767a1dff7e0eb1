"""A store that promises blocks it no longer has: the resume recomputes, never errs or
gives other tokens (vLLM's kv_load_failure_policy="recompute", real engine)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from kvstore.trace import read_trace
from tests.kvstore.conftest import ConnectedEngine, connected_engine
from tests.kvstore.test_connector import _logprobs

pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def lossy(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ConnectedEngine]:
    with connected_engine(tmp_path_factory.mktemp("lossy"),
                          ("LossyConnector", "tests.kvstore.lossy")) as engine:
        yield engine


async def test_a_lost_entry_falls_back_to_recompute(lossy: ConnectedEngine) -> None:
    prompt = [(13 * i) % 5000 + 100 for i in range(300)]
    reference = await lossy.generate(prompt, "reference", max_tokens=30)
    generated = await lossy.generate_then_abort(prompt, "preempted", 30, abort_after=10,
                                                kv_transfer_params={"kvstore": "offload"})
    resumed = await lossy.generate(prompt + generated, "resumed",
                                   max_tokens=30 - len(generated))
    assert generated + list(resumed.outputs[0].token_ids) == list(
        reference.outputs[0].token_ids)
    assert _logprobs(resumed) == pytest.approx(_logprobs(reference)[len(generated):], abs=1e-4)
    # The load failed and vLLM prefilled the lost blocks again: after a first step for the
    # one token past the stored ones, the resumed request was scheduled for its whole
    # context (the lost tail's block included).
    steps = [n for c in read_trace(lossy.trace_path) if c.hook == "build_connector_meta"
             for r, n in c.detail["num_scheduled_tokens"].items() if r.startswith("resumed")]
    context = len(prompt) + len(generated)
    assert steps[:2] == [1, context]
    # vLLM still counts the tokens it planned to load as cached: a resume metric must take
    # load failures from kvstore, not from num_cached_tokens.
    assert resumed.num_cached_tokens == context - 1
