"""A byte-budgeted CPU store of KV blocks keyed by chained token-prefix hashes.

The store has two halves because vLLM runs its connector in two processes that share no
memory (docs/kvstore.md): `BlockIndex` (what is stored, the byte budget, LRU, counters)
lives with the scheduler, which alone answers "how many of this request's tokens are
stored?"; `BlockData` (the bytes) lives with the worker, which alone touches the paged KV
cache. The index decides every admission and eviction; the data half only executes them,
so both agree as long as the worker applies the index's decisions in order.

Keys are chained block hashes: the hash of block i covers block i's tokens and the hash of
block i-1, so a key names a whole prefix. Inside the engine they are vLLM's own
`request.block_hashes`; `chain_hashes` computes the same kind of chain for callers
without vLLM.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence

import msgspec
import torch

from kvstore.quant import Quantization, dequantize, quantize


def chain_hashes(token_ids: Sequence[int], block_tokens: int) -> list[bytes]:
    """sha256 over (parent hash, block tokens) for each *full* block, as vLLM's prefix cache
    chains its block hashes; a partial last block has no hash."""
    hashes: list[bytes] = []
    parent = b""
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        tokens = array("q", token_ids[start:start + block_tokens]).tobytes()
        parent = hashlib.sha256(parent + tokens).digest()
        hashes.append(parent)
    return hashes


class StoreCounters(msgspec.Struct):
    """Totals since the store was created (tokens and bytes), and what it holds now."""

    stored_bytes: int = 0
    stored_blocks: int = 0
    saved_tokens: int = 0
    saved_bytes: int = 0
    loaded_tokens: int = 0
    loaded_bytes: int = 0
    evicted_tokens: int = 0
    evicted_bytes: int = 0


class Admission(msgspec.Struct, frozen=True):
    stored: list[bytes]  # to save now, in prefix order
    evicted: list[bytes]  # to drop now


class BlockIndex:
    """Which blocks are stored, within `capacity_bytes`, least recently used out first.

    Every block costs `block_bytes` (the encoded size of one block over all layers).
    A prefix is only useful from its first block, so the blocks of one prefix are
    ordered deepest-first in the LRU: eviction trims prefixes from their tail.
    """

    def __init__(self, capacity_bytes: int, block_tokens: int, block_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.block_tokens = block_tokens
        self.block_bytes = block_bytes
        self.counters = StoreCounters()
        self._lru: OrderedDict[bytes, None] = OrderedDict()  # first = least recently used

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._lru

    def __len__(self) -> int:
        return len(self._lru)

    def lookup(self, hashes: Sequence[bytes]) -> int:
        """How many leading blocks of `hashes` are stored (no side effects)."""
        count = 0
        for block_hash in hashes:
            if block_hash not in self._lru:
                break
            count += 1
        return count

    def admit(self, hashes: Sequence[bytes]) -> Admission:
        """Make room for and record the blocks of one prefix, in order, stopping at the
        first that cannot fit (a block without its predecessors is useless)."""
        capacity_blocks = self.capacity_bytes // self.block_bytes
        usable = list(hashes[:capacity_blocks])
        self._touch(usable)  # what is already stored is kept, not evicted for its own tail
        stored, evicted = [], []
        for block_hash in usable:
            if block_hash in self._lru:
                continue
            if len(self._lru) >= capacity_blocks:
                victim = next(iter(self._lru))
                if victim in usable:
                    break  # only this prefix's own blocks are left to evict
                del self._lru[victim]
                evicted.append(victim)
            self._lru[block_hash] = None
            stored.append(block_hash)
        self._touch(usable)
        self._count(stored, evicted)
        return Admission(stored, evicted)

    def mark_loaded(self, hashes: Sequence[bytes]) -> None:
        self._touch(list(hashes))
        self.counters.loaded_tokens += len(hashes) * self.block_tokens
        self.counters.loaded_bytes += len(hashes) * self.block_bytes

    def unmark_loaded(self, num_blocks: int) -> None:
        """Blocks counted as loaded whose load failed (vLLM computes them again)."""
        self.counters.loaded_tokens -= num_blocks * self.block_tokens
        self.counters.loaded_bytes -= num_blocks * self.block_bytes

    def _touch(self, hashes: list[bytes]) -> None:
        for block_hash in reversed(hashes):  # deepest first: least recently used of these
            if block_hash in self._lru:
                self._lru.move_to_end(block_hash)

    def _count(self, stored: list[bytes], evicted: list[bytes]) -> None:
        counters = self.counters
        counters.saved_tokens += len(stored) * self.block_tokens
        counters.saved_bytes += len(stored) * self.block_bytes
        counters.evicted_tokens += len(evicted) * self.block_tokens
        counters.evicted_bytes += len(evicted) * self.block_bytes
        counters.stored_blocks = len(self._lru)
        counters.stored_bytes = len(self._lru) * self.block_bytes


class BlockData:
    """The stored blocks' bytes, encoded; it executes the index's decisions."""

    def __init__(self, quantization: Quantization) -> None:
        self.quantization = quantization
        self._blocks: dict[bytes, tuple[torch.Tensor, torch.Tensor | None]] = {}

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def nbytes(self) -> int:
        return sum(values.nbytes + (0 if scales is None else scales.nbytes)
                   for values, scales in self._blocks.values())

    def put(self, block_hash: bytes, block: torch.Tensor) -> None:
        """Keep a copy of `block` [..., tokens, channels]."""
        if self.quantization == "int8":
            self._blocks[block_hash] = quantize(block)
        else:
            self._blocks[block_hash] = (block.detach().clone(), None)

    def get(self, block_hash: bytes, dtype: torch.dtype) -> torch.Tensor | None:
        entry = self._blocks.get(block_hash)
        if entry is None:
            return None
        values, scales = entry
        return values.to(dtype) if scales is None else dequantize(values, scales, dtype)

    def drop(self, block_hash: bytes) -> None:
        self._blocks.pop(block_hash, None)
