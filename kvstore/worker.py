"""The connector's worker half: copies blocks between vLLM's paged KV cache and BlockData.

Runs in vLLM's worker process. On the CPU engine each layer's cache is
`[num_blocks, num_kv_heads, block_size, 2 * head_size]`, and the attention kernel reads a
block as `[num_kv_heads, 2 * block_size, head_size]` with K in the first half of dim 1 and
V in the second (docs/kvstore.md). A stored block is all layers of one block id viewed as
`[layers, heads, K|V, tokens, head_size]`, so INT8 scales are per layer, head, K|V and
channel. Only V is token-major in that view: the K half's rows are not one token each
(float32 on the "vec" ISA: rows 4k and 4k+1 hold tokens 4k and 4k+1, rows 4k+2 and 4k+3
do not), so a partial last block (a tail) is copied as its whole block too; the slots past
its tokens are written by the loading request's own forward before attention reads them.
"""

from __future__ import annotations

import torch

from kvstore.plan import StepPlan
from kvstore.quant import Quantization
from kvstore.store import BlockData


class BlockMover:
    def __init__(self, quantization: Quantization) -> None:
        self.data = BlockData(quantization)
        self._layers: list[torch.Tensor] = []
        self._saved_request_ids: set[str] = set()
        self._finished_request_ids: set[str] = set()
        self._load_errors: set[int] = set()

    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._layers = list(kv_caches.values())

    def block_shape(self) -> tuple[int, ...]:
        """[layers, heads, K|V, tokens, head_size] of one stored block."""
        _, heads, tokens, channels = self._layers[0].shape
        return (len(self._layers), heads, 2, tokens, channels // 2)

    def apply(self, plan: StepPlan) -> None:
        """Drops, then saves (their blocks are held for us until we report them), then
        loads: a block saved and loaded in one step reads what was just saved."""
        for block_hash in plan.drops:
            self.data.drop(block_hash)
        for block_hash, block_id in plan.saves:
            self.data.put(block_hash, self._read(block_id))
        self._saved_request_ids.update(plan.saving_request_ids)
        for block_hash, block_id in plan.loads:
            block = self.data.get(block_hash, self._layers[0].dtype)
            if block is None:
                self._load_errors.add(block_id)  # vLLM recomputes from this block on
            else:
                self._write(block_id, block)

    def finished_saves(self, finished_request_ids: set[str]) -> set[str]:
        """Saved requests vLLM has already told us are finished (it accepts no others)."""
        self._finished_request_ids |= finished_request_ids
        done = self._saved_request_ids & self._finished_request_ids
        self._saved_request_ids -= done
        self._finished_request_ids -= done
        if not self._saved_request_ids:
            self._finished_request_ids.clear()  # nothing pending: no id to remember
        return done

    def take_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def _read(self, block_id: int) -> torch.Tensor:
        shape = self.block_shape()[1:]
        return torch.stack([layer[block_id].view(shape) for layer in self._layers])

    def _write(self, block_id: int, block: torch.Tensor) -> None:
        for layer, layer_block in zip(self._layers, block, strict=True):
            layer[block_id].copy_(layer_block.view(layer[block_id].shape))
