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
without vLLM. A sequence that ends inside a block also has a *tail*: its partial last
block, stored under a key of its own (`tail_key`: the last whole block's hash and the
tail's tokens) and found through its parent (the whole blocks before it), one tail per
parent, the latest saved; a later request uses as many of its first tokens as agree with
its own. A tail costs one block's bytes and is the deepest entry of its prefix.
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


_TAIL = b"tail"  # sets tail keys apart from block hashes of the same bytes


def tail_key(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The key of a partial last block: its tokens after the whole blocks whose last
    chained hash is `parent` (b"" when there are none)."""
    return hashlib.sha256(_TAIL + parent + array("q", tokens).tobytes()).digest()


Entry = tuple[bytes, int]  # (key, tokens): a whole block, or the first tokens of a tail


def _parent(hashes: Sequence[bytes]) -> bytes:
    return hashes[-1] if hashes else b""


def _agreeing(stored: Sequence[int], wanted: Sequence[int]) -> int:
    count = 0
    for have, want in zip(stored, wanted):
        if have != want:
            break
        count += 1
    return count


class StoreCounters(msgspec.Struct):
    """Totals since the store was created (tokens and bytes), and what it holds now."""

    stored_bytes: int = 0
    stored_blocks: int = 0  # entries: whole blocks and tails
    saved_tokens: int = 0
    saved_bytes: int = 0
    loaded_tokens: int = 0
    loaded_bytes: int = 0
    evicted_tokens: int = 0
    evicted_bytes: int = 0


class Admission(msgspec.Struct, frozen=True):
    stored: list[Entry]  # to save now, in prefix order
    evicted: list[bytes]  # to drop now


class BlockIndex:
    """Which entries are stored, within `capacity_bytes`, least recently used out first.

    Every entry, whole block or tail, costs `block_bytes` (the encoded size of one block
    over all layers). A prefix is only useful from its first block, so the entries of one
    prefix are ordered deepest-first in the LRU: eviction trims prefixes from their tail.
    """

    def __init__(self, capacity_bytes: int, block_tokens: int, block_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.block_tokens = block_tokens
        self.block_bytes = block_bytes
        self.counters = StoreCounters()
        # key -> (tokens, its parent if it is a tail); first = least recently used
        self._lru: OrderedDict[bytes, tuple[int, bytes | None]] = OrderedDict()
        self._tails: dict[bytes, tuple[bytes, tuple[int, ...]]] = {}  # parent -> key, tokens

    def __contains__(self, key: bytes) -> bool:
        return key in self._lru

    def __len__(self) -> int:
        return len(self._lru)

    def lookup(self, hashes: Sequence[bytes]) -> int:
        """How many leading whole blocks of `hashes` are stored (no side effects)."""
        count = 0
        for block_hash in hashes:
            if block_hash not in self._lru:
                break
            count += 1
        return count

    def tail(self, hashes: Sequence[bytes], token_ids: Sequence[int]) -> Entry | None:
        """The stored tail after the whole blocks `hashes` and how many of its first tokens
        are `token_ids`' first ones (None if none are; no side effects)."""
        found = self._tails.get(_parent(hashes))
        if found is None:
            return None
        key, stored = found
        agreeing = _agreeing(stored, token_ids)
        return (key, agreeing) if agreeing else None

    def admit(self, hashes: Sequence[bytes], tail: Sequence[int] = ()) -> Admission:
        """Make room for and record one prefix: whole blocks `hashes`, then the tail tokens
        `tail` after them (replacing the tail stored after the same blocks), in order,
        stopping at the first that cannot fit (an entry without its predecessors is
        useless)."""
        entries = [(block_hash, self.block_tokens) for block_hash in hashes]
        parent = _parent(hashes)
        new_tail = tail_key(parent, tail) if tail else None
        if new_tail is not None:
            entries.append((new_tail, len(tail)))
        capacity = self.capacity_bytes // self.block_bytes
        usable = entries[:capacity]
        keys = {key for key, _ in usable}
        self._touch(usable)  # what is already stored is kept, not evicted for its own tail
        stored: list[Entry] = []
        evicted: list[Entry] = []
        for key, tokens in usable:
            if key in self._lru:
                continue
            is_tail = key == new_tail
            if is_tail and (old := self._tails.get(parent)) is not None:
                evicted.append(self._evict(old[0]))  # one tail per parent: the latest
            if len(self._lru) >= capacity:
                victim = next(iter(self._lru))
                if victim in keys:
                    break  # only this prefix's own entries are left to evict
                evicted.append(self._evict(victim))
            self._lru[key] = (tokens, parent if is_tail else None)
            if is_tail:
                self._tails[parent] = (key, tuple(tail))
            stored.append((key, tokens))
        self._touch(usable)
        self._count(stored, evicted)
        return Admission(stored, [key for key, _ in evicted])

    def mark_loaded(self, entries: Sequence[Entry]) -> None:
        self._touch(list(entries))
        self.counters.loaded_tokens += sum(tokens for _, tokens in entries)
        self.counters.loaded_bytes += len(entries) * self.block_bytes

    def unmark_loaded(self, num_entries: int, tokens: int) -> None:
        """Entries counted as loaded whose load failed (vLLM computes them again)."""
        self.counters.loaded_tokens -= tokens
        self.counters.loaded_bytes -= num_entries * self.block_bytes

    def _evict(self, key: bytes) -> Entry:
        tokens, parent = self._lru.pop(key)
        if parent is not None and self._tails.get(parent, (None,))[0] == key:
            del self._tails[parent]
        return key, tokens

    def _touch(self, entries: list[Entry]) -> None:
        for key, _ in reversed(entries):  # deepest first: least recently used of these
            if key in self._lru:
                self._lru.move_to_end(key)

    def _count(self, stored: list[Entry], evicted: list[Entry]) -> None:
        counters = self.counters
        counters.saved_tokens += sum(tokens for _, tokens in stored)
        counters.saved_bytes += len(stored) * self.block_bytes
        counters.evicted_tokens += sum(tokens for _, tokens in evicted)
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
