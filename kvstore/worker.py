"""The connector's worker half: copies blocks between vLLM's paged KV cache and BlockData.

Runs in vLLM's worker process. On the CPU engine each layer's cache is
`[num_blocks, num_kv_heads, block_size, 2 * head_size]`, and the attention kernel reads a
block as `[num_kv_heads, 2 * block_size, head_size]` with K in the first half of dim 1 and
V in the second (docs/kvstore.md). How a half orders its `block_size * head_size` elements
is the kernel's choice and depends on its ISA: on "vec" (x86 without AMX, float32 and
bfloat16) V is token-major but K is channel-major (`[head_size, block_size]`).

`cache_layout` finds that order by writing a scratch block with the engine's own cache
write (vLLM's `cpu_attn_reshape_and_cache`, the ISA vLLM picks) and the mover reorders
both halves to token-major on save (and back on load), so a stored block is
`[layers, heads, K|V, tokens, head_size]` in fact, and INT8 scales taken over its tokens
axis are per layer, head, K|V and channel. Where the order cannot be found (no vLLM op,
a dtype or size the probe cannot encode exactly, an order that is not a permutation) a
half is kept in cache order: the round-trip bound still holds, but the "channels" of such
a half are groups of elements, not channels. A partial last block (a tail) is still copied
as its whole block; the slots past its tokens are written by the loading request's own
forward before attention reads them.
"""

from __future__ import annotations

import torch

from kvstore.plan import StepPlan
from kvstore.quant import Quantization
from kvstore.store import BlockData

# Orders of the K and V halves: `half.flatten()[order]` is token-major (or _CHANNEL_MAJOR);
# None: keep as is.
HalfOrders = tuple[torch.Tensor | None, torch.Tensor | None]
# Stands for the channel-major order, which a transpose undoes.
_CHANNEL_MAJOR = torch.empty(0, dtype=torch.long)
# Integers up to 256 are exact in bfloat16, float16 and float32: the probe's codes.
_EXACT_CODES = 256


def cache_layout(dtype: torch.dtype, block_size: int, head_size: int) -> HalfOrders:
    """For the K and V halves of one head of a block: the cache positions in token-major
    order (`order[t * head_size + c]` holds token t, channel c), or None if not found."""
    if dtype not in (torch.float32, torch.bfloat16, torch.float16) or max(
            block_size, head_size) > _EXACT_CODES:
        return None, None
    try:
        from vllm import _custom_ops as ops
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        isa = _get_attn_isa(dtype, block_size, head_size)
        cache = torch.full((1, 1, block_size, 2 * head_size), -1.0, dtype=dtype)
        key_cache, value_cache = cache.view(1, 1, 2 * block_size, head_size).chunk(2, dim=2)
        codes = []
        for axis in (0, 2):  # write each element's token, then its channel
            index = torch.arange(block_size if axis == 0 else head_size, dtype=dtype)
            shape = [1, 1, 1]
            shape[axis] = -1
            values = index.view(shape).expand(block_size, 1, head_size).contiguous()
            ops.cpu_attn_reshape_and_cache(values, values, key_cache, value_cache,
                                           torch.arange(block_size), isa)
            codes.append(cache.view(2, -1).long())
    except Exception:  # noqa: BLE001 - no op, or it refuses: keep the cache order
        return None, None
    canonical = codes[0] * head_size + codes[1]  # where each cache element belongs
    orders = []
    for half in canonical:
        order = torch.argsort(half)
        is_permutation = torch.equal(half[order], torch.arange(half.numel()))
        orders.append(order if is_permutation else None)
    return orders[0], orders[1]


def describe(order: torch.Tensor | None, block_size: int, head_size: int) -> str:
    if order is None:
        return "unknown"
    n = block_size * head_size
    if torch.equal(order, torch.arange(n)):
        return "token-major"
    if torch.equal(order, torch.arange(n).view(head_size, block_size).t().flatten()):
        return "channel-major"
    return "permuted"


class BlockMover:
    def __init__(self, quantization: Quantization) -> None:
        self.data = BlockData(quantization)
        self._layers: list[torch.Tensor] = []
        self._to_tokens: HalfOrders = (None, None)  # cache order -> token-major
        self._to_cache: HalfOrders = (None, None)  # and back
        self.layout = {"K": "unknown", "V": "unknown"}
        self._saved_request_ids: set[str] = set()
        self._finished_request_ids: set[str] = set()
        self._load_errors: set[int] = set()

    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._layers = list(kv_caches.values())
        _, _, tokens, channels = self.block_shape()[1:]
        orders = cache_layout(self._layers[0].dtype, tokens, channels)
        self.layout = {name: describe(order, tokens, channels)
                       for name, order in zip("KV", orders, strict=True)}
        kept = [None if layout in ("unknown", "token-major") else
                _CHANNEL_MAJOR if layout == "channel-major" else order
                for order, layout in zip(orders, self.layout.values(), strict=True)]
        self._to_tokens = (kept[0], kept[1])
        inverse = [order if order is None or order is _CHANNEL_MAJOR else torch.argsort(order)
                   for order in kept]
        self._to_cache = (inverse[0], inverse[1])

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
        """All layers of one block, token-major where the layout is known."""
        shape = self.block_shape()
        heads, tokens, channels = shape[1], shape[3], shape[4]
        block = torch.empty(shape, dtype=self._layers[0].dtype)
        for layer, out in zip(self._layers, block, strict=True):
            halves = layer[block_id].view(heads, 2, -1)
            for half, order in enumerate(self._to_tokens):
                source = halves[:, half]
                if order is _CHANNEL_MAJOR:  # a strided copy, far cheaper than a gather
                    out[:, half].copy_(source.view(heads, channels, tokens).transpose(1, 2))
                elif order is not None:
                    out[:, half].copy_(source.index_select(-1, order).view(heads, tokens, -1))
                else:
                    out[:, half].copy_(source.view(heads, tokens, channels))
        return block

    def _write(self, block_id: int, block: torch.Tensor) -> None:
        heads, tokens, channels = block.shape[1], block.shape[3], block.shape[4]
        for layer, source in zip(self._layers, block, strict=True):
            halves = layer[block_id].view(heads, 2, -1)
            for half, order in enumerate(self._to_cache):
                out, values = halves[:, half], source[:, half]
                if order is _CHANNEL_MAJOR:
                    out.view(heads, channels, tokens).copy_(values.transpose(1, 2))
                elif order is not None:
                    out.copy_(values.reshape(heads, -1).index_select(-1, order))
                else:
                    out.view(heads, tokens, channels).copy_(values)
