from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.support import TINY

# 1 GiB of KV cache in the engine (VLLM_CPU_KVCACHE_SPACE takes whole GiB).
_ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


@dataclass
class ConnectedEngine:
    """A real vLLM engine (CPU, tiny model, float32) with kvstore's connector loaded."""

    engine: Any  # vllm.v1.engine.async_llm.AsyncLLM
    trace_path: Path

    async def generate(self, prompt: list[int], request_id: str, max_tokens: int,
                       kv_transfer_params: dict[str, Any] | None = None) -> Any:
        """Greedy generation to the end; the final RequestOutput."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        extra = {"kv_transfer_params": kv_transfer_params} if kv_transfer_params else None
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                                extra_args=extra)
        final = None
        async for out in self.engine.generate(TokensPrompt(prompt_token_ids=prompt), params,
                                              request_id):
            final = out
        assert final is not None
        return final


def _build(trace_path: Path, extra_config: dict[str, Any]) -> Any:
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    transfer = KVTransferConfig(
        kv_connector="LengthwiseConnector", kv_role="kv_both",
        kv_connector_module_path="kvstore.connector",
        kv_connector_extra_config={"trace_path": str(trace_path), **extra_config})
    # Prefix caching off: every cached token a request reports came through the connector.
    args = AsyncEngineArgs(model=str(TINY), dtype="float32", enforce_eager=True,
                           max_model_len=1024, max_num_seqs=2, enable_prefix_caching=False,
                           disable_log_stats=True, kv_transfer_config=transfer)
    saved = {key: os.environ.get(key) for key in _ENGINE_ENV}
    os.environ.update(_ENGINE_ENV)
    try:
        return AsyncLLM.from_engine_args(args)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def connected(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ConnectedEngine]:
    if not (TINY / "config.json").exists():
        pytest.fail(f"{TINY} is missing: run `make models`")
    trace_path = tmp_path_factory.mktemp("kvstore") / "hooks.jsonl"
    engine = _build(trace_path, {})
    try:
        yield ConnectedEngine(engine, trace_path)
    finally:
        engine.shutdown()
