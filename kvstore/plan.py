"""The connector's scheduler half: what to save, drop and load, decided on the index.

Runs in vLLM's EngineCore process. It sees requests (token hashes, block ids, the
per-request `kv_transfer_params`) but never KV bytes; each engine step it hands the worker
half a `StepPlan` to execute in order: drops, then saves, then loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from kvstore import decisions
from kvstore.store import BlockIndex, Entry

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
    # (key, block id). A tail is saved and loaded as its whole block: the paged cache's K
    # half is not token-major on every CPU ISA (docs/kvstore.md), and the slots past a
    # request's loaded tokens are written by its own forward before attention reads them.
    saves: list[tuple[bytes, int]] = field(default_factory=list)
    loads: list[tuple[bytes, int]] = field(default_factory=list)
    # Requests whose blocks vLLM keeps until the worker reports these saves done.
    saving_request_ids: list[str] = field(default_factory=list)


@dataclass
class _Load:
    first_block: int  # index in the request's blocks of the first block to load
    entries: list[Entry]


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
        # The last plan's loads: block id -> (request id, entries and tokens from this one
        # to the end of its load), to count the tokens vLLM recomputes when the worker
        # reports a failed load.
        self._loading: dict[int, tuple[str, int, int]] = {}
        self.load_failed_tokens = 0
        self._next = StepPlan()

    def matched_tokens(self, request_id: str, hashes: Sequence[bytes],
                       token_ids: Sequence[int], num_computed_tokens: int) -> int:
        """Tokens beyond `num_computed_tokens` (vLLM's own hits: whole blocks) the store can
        supply: stored whole blocks, then the first tokens of the next block if it is
        stored whole, else as much of the stored tail after them as agrees with the
        request's tokens, leaving one token to compute (vLLM needs its logits)."""
        block = self.index.block_tokens
        limit = len(token_ids) - 1
        usable = hashes[:limit // block]
        first = num_computed_tokens // block
        stored = self.index.lookup(usable)
        entries: list[Entry] = [(block_hash, block) for block_hash in usable[first:stored]]
        rest = token_ids[stored * block:limit]  # what the next block could supply
        if stored >= first and rest:
            if stored < len(hashes) and hashes[stored] in self.index:
                entries.append((hashes[stored], len(rest)))
            elif tail := self.index.tail(usable[:stored], rest):
                entries.append(tail)
        if not entries:
            self._matched.pop(request_id, None)
            return 0
        self._matched[request_id] = _Load(first, entries)
        return sum(tokens for _, tokens in entries)

    def allocated(self, request_id: str, num_external_tokens: int) -> None:
        load = self._matched.pop(request_id, None)
        if num_external_tokens > 0 and load is not None:
            self._loads[request_id] = load

    def finished(self, request_id: str, hashes: Sequence[bytes], token_ids: Sequence[int],
                 num_computed_tokens: int, block_ids: list[int], offload: bool) -> int:
        """Plan the save of a finished request's computed tokens: its whole blocks and the
        tail in the block after them; how many tokens."""
        self._matched.pop(request_id, None)
        self._loads.pop(request_id, None)
        if not offload:
            return 0
        block = self.index.block_tokens
        full = min(num_computed_tokens // block, len(hashes), len(block_ids))
        whole_blocks_only = full < num_computed_tokens // block or full == len(block_ids)
        tail = [] if whole_blocks_only else token_ids[full * block:num_computed_tokens]
        admission = self.index.admit(hashes[:full], tail)
        if not admission.stored:
            return 0
        position = {block_hash: i for i, block_hash in enumerate(hashes[:full])}
        plan = self._next
        plan.drops.extend(admission.evicted)
        plan.saves.extend((key, block_ids[position.get(key, full)])  # the tail: block `full`
                          for key, _ in admission.stored)
        plan.saving_request_ids.append(request_id)
        return sum(tokens for _, tokens in admission.stored)

    def load_failed(self, block_ids: set[int]) -> None:
        """The worker could not load these blocks of the last plan: vLLM recomputes each
        affected request from its first failed block on."""
        first_failed: dict[str, tuple[int, int]] = {}  # request -> (entries, tokens) lost
        for block_id in block_ids:
            if (where := self._loading.get(block_id)) is None:
                continue
            request_id, entries, tokens = where
            first_failed[request_id] = max(first_failed.get(request_id, (0, 0)),
                                           (entries, tokens))
        for entries, tokens in first_failed.values():
            self.load_failed_tokens += tokens
            self.index.unmark_loaded(entries, tokens)

    def build(self, scheduled: list[tuple[str, list[int]]]) -> StepPlan:
        """This step's plan; `scheduled`: (request id, all its block ids) for the requests
        that start (or restart) this step, the only ones with blocks to load into."""
        self._loading = {}
        for request_id, block_ids in scheduled:
            load = self._loads.pop(request_id, None)
            if load is None:
                continue
            ids = block_ids[load.first_block:load.first_block + len(load.entries)]
            remaining = sum(tokens for _, tokens in load.entries)
            for i, ((key, tokens), block_id) in enumerate(zip(load.entries, ids, strict=True)):
                self._next.loads.append((key, block_id))
                self._loading[block_id] = (request_id, len(ids) - i, remaining)
                remaining -= tokens
            self.index.mark_loaded(load.entries)
        self._step += 1
        plan, self._next = self._next, StepPlan()
        plan.step = self._step
        return plan
