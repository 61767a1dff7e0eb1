from __future__ import annotations

import hypothesis.strategies as st
import torch
from hypothesis import given, settings

from kvstore.store import BlockData, BlockIndex, chain_hashes, tail_key

BLOCK = 4  # tokens per block


def _index(capacity_blocks: int, block_bytes: int = 100) -> BlockIndex:
    return BlockIndex(capacity_blocks * block_bytes, BLOCK, block_bytes)


def _whole(hashes: list[bytes]) -> list[tuple[bytes, int]]:
    return [(h, BLOCK) for h in hashes]


def test_chain_hashes_name_whole_prefixes() -> None:
    a = chain_hashes(list(range(10)), BLOCK)
    assert len(a) == 2  # 10 tokens: two full blocks, the partial third has no hash
    b = chain_hashes([0, 1, 2, 3, 9, 9, 9, 9], BLOCK)
    assert a[0] == b[0] and a[1] != b[1]
    # Same tokens after a different prefix: a different key.
    assert chain_hashes([7, 7, 7, 7, 4, 5, 6, 7], BLOCK)[1] != a[1]


def test_lookup_returns_the_longest_stored_prefix_in_whole_blocks() -> None:
    index = _index(8)
    tokens = list(range(20))
    hashes = chain_hashes(tokens, BLOCK)
    index.admit(hashes[:3])
    assert index.lookup(hashes) == 3
    assert index.lookup(chain_hashes(tokens[:14], BLOCK)) == 3  # 14 tokens: 3 whole blocks
    assert index.lookup(chain_hashes(tokens[:11], BLOCK)) == 2
    assert index.lookup(chain_hashes([99] + tokens[1:], BLOCK)) == 0  # first block differs


def test_a_tail_is_found_after_its_whole_blocks_as_far_as_its_tokens_agree() -> None:
    index = _index(8)
    tokens = list(range(20))
    hashes = chain_hashes(tokens, BLOCK)
    admission = index.admit(hashes[:2], tokens[8:11])  # 2 blocks and a 3-token tail
    tail = tail_key(hashes[1], tokens[8:11])
    assert admission.stored == [*_whole(hashes[:2]), (tail, 3)]
    assert index.counters.saved_tokens == 11 and index.counters.stored_bytes == 300
    assert index.tail(hashes[:2], tokens[8:11]) == (tail, 3)
    assert index.tail(hashes[:2], tokens[8:10]) == (tail, 2)  # the first 2 tail tokens
    assert index.tail(hashes[:2], [8, 99, 10]) == (tail, 1)
    assert index.tail(hashes[:2], tokens[8:12]) == (tail, 3)  # longer: only what is stored
    assert index.tail(hashes[:2], [99]) is None
    assert index.tail(hashes[:1], tokens[4:7]) is None  # no tail after block 0
    # A new tail after the same blocks replaces the old one (one tail per parent).
    admission = index.admit(hashes[:2], [8, 9, 7])
    new = tail_key(hashes[1], [8, 9, 7])
    assert admission.stored == [(new, 3)] and admission.evicted == [tail]
    assert index.tail(hashes[:2], tokens[8:11]) == (new, 2) and tail not in index
    assert index.counters.evicted_tokens == 3
    # A tail with no whole block before it.
    index.admit([], [5, 6])
    assert index.tail([], [5, 6, 7]) == (tail_key(b"", [5, 6]), 2)


def test_eviction_is_least_recently_used_and_trims_prefixes_from_their_tail() -> None:
    index = _index(4)
    first = chain_hashes(list(range(12)), BLOCK)  # 3 blocks
    second = chain_hashes(list(range(100, 108)), BLOCK)  # 2 blocks
    assert index.admit(first).stored == _whole(first)
    admission = index.admit(second)
    # One block had to go: the deepest of the older prefix, so its first two stay usable.
    assert admission.stored == _whole(second) and admission.evicted == [first[2]]
    assert index.lookup(first) == 2 and index.lookup(second) == 2
    index.mark_loaded(_whole(first[:2]))  # used again: now the other prefix is the older one
    third = chain_hashes(list(range(200, 204)), BLOCK)
    assert index.admit(third).evicted == [second[1]]
    counters = index.counters
    assert (counters.saved_tokens, counters.evicted_tokens, counters.loaded_tokens) == (
        6 * BLOCK, 2 * BLOCK, 2 * BLOCK)
    assert counters.stored_blocks == 4 and counters.stored_bytes == 400


def test_a_prefix_longer_than_the_budget_keeps_its_head() -> None:
    index = _index(2)
    hashes = chain_hashes(list(range(20)), BLOCK)
    assert index.admit(hashes).stored == _whole(hashes[:2])
    assert index.lookup(hashes) == 2
    assert index.admit(hashes).stored == []  # already stored: nothing to save again
    assert index.admit(hashes, [20, 21]).stored == []  # no room for the tail either


def test_a_tail_costs_a_block_and_goes_before_its_blocks() -> None:
    index = _index(3)
    tokens = list(range(10))
    hashes = chain_hashes(tokens, BLOCK)
    index.admit(hashes, tokens[8:])  # 2 blocks and a 2-token tail
    assert index.counters.stored_bytes == 300 and index.counters.saved_tokens == 10
    other = chain_hashes(list(range(100, 104)), BLOCK)
    assert index.admit(other).evicted == [tail_key(hashes[1], [8, 9])]  # deepest first
    assert index.counters.evicted_tokens == 2 and index.tail(hashes, [8, 9]) is None


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(0, 6),
       ops=st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.integers(0, 24)),
                    max_size=30))
def test_budget_is_never_exceeded(capacity: int, ops: list[tuple[bool, int, int]]) -> None:
    """Random saves and loads of prefixes (whole blocks and their tails) drawn from a few
    shared conversations: the index stays within budget, its counters add up and every
    lookup is a stored prefix."""
    index = _index(capacity)
    stored: dict[bytes, int] = {}  # key -> tokens
    for is_save, conversation, length in ops:
        tokens = [conversation] * 3 + list(range(length))
        hashes = chain_hashes(tokens, BLOCK)
        tail = tokens[len(hashes) * BLOCK:]
        if is_save:
            admission = index.admit(hashes, tail)
            for key in admission.evicted:
                del stored[key]
            stored.update(admission.stored)
        else:
            found = index.lookup(hashes)
            entries = _whole(hashes[:found])
            if found == len(hashes) and (entry := index.tail(hashes, tail)) is not None:
                entries.append(entry)
            index.mark_loaded(entries)
        counters = index.counters
        assert counters.stored_bytes <= index.capacity_bytes
        assert counters.stored_bytes == len(stored) * index.block_bytes == len(index) * 100
        assert counters.saved_tokens - counters.evicted_tokens == sum(stored.values())
        found = index.lookup(hashes)
        assert all(stored.get(h) == BLOCK for h in hashes[:found])
        if (entry := index.tail(hashes[:found], tokens[found * BLOCK:])) is not None:
            assert 0 < entry[1] <= stored[entry[0]]


def test_block_data_round_trips_and_drops() -> None:
    block = torch.randn(2, 2, 2, 128, 32, dtype=torch.bfloat16)  # [layers, heads, K|V, ...]
    plain, packed = BlockData("none"), BlockData("int8")
    for data in (plain, packed):
        data.put(b"k", block)
    block.zero_()  # the store holds a copy, not a view of the engine's cache
    restored = plain.get(b"k", torch.bfloat16)
    assert restored is not None and restored.abs().sum() > 0
    assert packed.nbytes < 0.52 * plain.nbytes
    plain.drop(b"k")
    assert plain.get(b"k", torch.bfloat16) is None and len(plain) == 0 and plain.nbytes == 0
