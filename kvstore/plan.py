"""The connector's scheduler half: what to save, drop and load, decided on the index.

Runs in vLLM's EngineCore process. It sees requests (token hashes, block ids, the
per-request `kv_transfer_params`) but never KV bytes; each engine step it hands the worker
half a `StepPlan` to execute in order: drops, then saves, then loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from kvstore import decisions
from kvstore.store import BlockIndex

# kv_transfer_params key and value by which a request asks that its blocks be kept
# whenever it finishes or is aborted (tests, benchmarks); the daemon instead asks at
# abort time (kvstore.decisions).
PARAM = decisions.PARAM
OFFLOAD = "offload"


@dataclass
class StepPlan(KVConnectorMetadata):
    """Scheduler -> worker, once per engine step (pickled between the two processes)."""

    step: int = 0
    drops: list[bytes] = field(default_factory=list)
    saves: list[tuple[bytes, int]] = field(default_factory=list)  # (block hash, block id)
    loads: list[tuple[bytes, int]] = field(default_factory=list)
    # Requests whose blocks vLLM keeps until the worker reports these saves done.
    saving_request_ids: list[str] = field(default_factory=list)


@dataclass
class _Load:
    first_block: int  # index in the request's blocks of the first block to load
    hashes: list[bytes]


def wants_offload(kv_transfer_params: dict[str, Any] | None,
                  decisions_dir: str | None = None) -> bool:
    """Whether a finishing request's blocks are to be saved: it was submitted with the
    offload flag, or with "ask" and the daemon marked it before aborting it."""
    if not kv_transfer_params:
        return False
    value = kv_transfer_params.get(PARAM)
    if value == decisions.ASK:
        return decisions.take_offload(decisions_dir, kv_transfer_params.get(decisions.ID))
    return value == OFFLOAD


class Planner:
    def __init__(self, index: BlockIndex) -> None:
        self.index = index
        self._step = 0
        self._matched: dict[str, _Load] = {}  # the last answer per request, until allocated
        self._loads: dict[str, _Load] = {}  # allocated, to load in the step that runs it
        # The last plan's loads: block id -> (request id, index in its load, load length),
        # to count the tokens vLLM recomputes when the worker reports a failed load.
        self._loading: dict[int, tuple[str, int, int]] = {}
        self.load_failed_tokens = 0
        self._next = StepPlan()

    def matched_tokens(self, request_id: str, hashes: list[bytes], num_tokens: int,
                       num_computed_tokens: int) -> int:
        """Tokens beyond `num_computed_tokens` the store can supply: whole stored blocks,
        leaving at least one token for the engine to compute (it needs logits)."""
        block = self.index.block_tokens
        usable = hashes[:(num_tokens - 1) // block]
        first = num_computed_tokens // block  # vLLM's own hits are whole blocks
        stored = self.index.lookup(usable)
        if stored <= first:
            self._matched.pop(request_id, None)
            return 0
        self._matched[request_id] = _Load(first, list(usable[first:stored]))
        return stored * block - num_computed_tokens

    def allocated(self, request_id: str, num_external_tokens: int) -> None:
        load = self._matched.pop(request_id, None)
        if num_external_tokens > 0 and load is not None:
            self._loads[request_id] = load

    def finished(self, request_id: str, hashes: list[bytes], num_computed_tokens: int,
                 block_ids: list[int], offload: bool) -> int:
        """Plan the save of a finished request's computed whole blocks; how many tokens."""
        self._matched.pop(request_id, None)
        self._loads.pop(request_id, None)
        if not offload:
            return 0
        full = hashes[:min(num_computed_tokens // self.index.block_tokens, len(block_ids))]
        admission = self.index.admit(full)
        if not admission.stored:
            return 0
        position = {block_hash: i for i, block_hash in enumerate(full)}
        plan = self._next
        plan.drops.extend(admission.evicted)
        plan.saves.extend((h, block_ids[position[h]]) for h in admission.stored)
        plan.saving_request_ids.append(request_id)
        return len(admission.stored) * self.index.block_tokens

    def load_failed(self, block_ids: set[int]) -> None:
        """The worker could not load these blocks of the last plan: vLLM recomputes each
        affected request from its first failed block on."""
        first_failed: dict[str, tuple[int, int]] = {}
        for block_id in block_ids:
            if (where := self._loading.get(block_id)) is None:
                continue
            request_id, position, length = where
            earlier = first_failed.get(request_id, (length, length))[0]
            first_failed[request_id] = (min(position, earlier), length)
        for position, length in first_failed.values():
            self.load_failed_tokens += (length - position) * self.index.block_tokens
            self.index.unmark_loaded(length - position)

    def build(self, scheduled: list[tuple[str, list[int]]]) -> StepPlan:
        """This step's plan; `scheduled`: (request id, all its block ids) for the requests
        that start (or restart) this step, the only ones with blocks to load into."""
        self._loading = {}
        for request_id, block_ids in scheduled:
            load = self._loads.pop(request_id, None)
            if load is None:
                continue
            ids = block_ids[load.first_block:load.first_block + len(load.hashes)]
            plan_loads = list(zip(load.hashes, ids, strict=True))
            self._next.loads.extend(plan_loads)
            self._loading.update((block_id, (request_id, i, len(ids)))
                                 for i, block_id in enumerate(ids))
            self.index.mark_loaded(load.hashes)
        self._step += 1
        plan, self._next = self._next, StepPlan()
        plan.step = self._step
        return plan
