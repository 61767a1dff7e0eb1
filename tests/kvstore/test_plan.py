"""The connector's scheduler half, without an engine."""

from __future__ import annotations

import math

from kvstore.plan import Planner, wants_offload
from kvstore.store import BlockIndex, chain_hashes, tail_key

BLOCK = 4


def _planner(capacity_blocks: int = 16) -> Planner:
    return Planner(BlockIndex(capacity_blocks * 10, BLOCK, 10))


def _saved(num_tokens: int, computed: int) -> tuple[Planner, list[int], list[bytes]]:
    """A planner whose store holds request "old" (tokens 0..num_tokens-1, `computed` of
    them computed, in blocks 0, 1, ...), its save sent; and that request's tokens and
    whole-block hashes."""
    planner = _planner()
    tokens = list(range(num_tokens))
    hashes = chain_hashes(tokens, BLOCK)
    block_ids = list(range(math.ceil(computed / BLOCK)))  # the tail has a block too
    planner.finished("old", hashes, tokens, computed, block_ids, offload=True)
    planner.build([])
    return planner, tokens, hashes


def test_offload_flag() -> None:
    assert wants_offload({"kvstore": "offload"})
    assert not wants_offload(None) and not wants_offload({"kvstore": "drop"})


def test_finished_request_saves_its_computed_whole_blocks_and_tail() -> None:
    planner = _planner()
    tokens = list(range(15))
    hashes = chain_hashes(tokens, BLOCK)  # 3 full blocks of 15 tokens
    # 14 tokens computed (the last generated token has no KV yet): 3 whole blocks and a
    # tail of 2 tokens in the fourth block.
    assert planner.finished("a", hashes, tokens, 14, [7, 8, 9, 10], offload=True) == 14
    assert planner.finished("b", hashes, tokens, 14, [1, 2, 3, 4], offload=False) == 0
    plan = planner.build([])
    tail = tail_key(hashes[2], tokens[12:14])
    assert plan.saves == [(hashes[0], 7), (hashes[1], 8), (hashes[2], 9), (tail, 10)]
    assert plan.saving_request_ids == ["a"] and plan.step == 1
    assert planner.build([]).saves == []  # each decision is sent once
    assert planner.index.counters.saved_tokens == 14


def test_matched_tokens_leave_one_token_to_compute_and_start_after_local_hits() -> None:
    planner, tokens, hashes = _saved(12, 12)
    # 12 tokens, all 3 blocks stored: the last token must still be computed, so only the
    # first 3 tokens of the last block are loaded.
    assert planner.matched_tokens("new", hashes, tokens, 0) == 11
    assert planner.matched_tokens("new", hashes, tokens, 4) == 7  # block 0: vLLM's own hit
    planner.allocated("new", 7)
    plan = planner.build([("new", [20, 21, 22])])
    assert plan.loads == [(hashes[1], 21), (hashes[2], 22)]
    assert planner.index.counters.loaded_tokens == 7


def test_a_resume_loads_everything_but_its_last_token() -> None:
    """Aborted after computing 10 tokens (2 blocks + a 2-token tail), resumed as its 11
    tokens: all 10 are loaded, the tail into the first slots of the third block."""
    planner, tokens, hashes = _saved(11, 10)
    assert planner.matched_tokens("new", hashes, tokens, 0) == 10
    assert planner.matched_tokens("new", hashes, tokens, 8) == 2  # only the tail is new
    planner.allocated("new", 2)
    plan = planner.build([("new", [5, 6, 7])])
    assert plan.loads == [(tail_key(hashes[1], tokens[8:10]), 7)]
    assert planner.index.counters.loaded_tokens == 2
    # Other tokens after the same whole blocks: the stored tail's tokens that agree.
    other = tokens[:9] + [99, 10]
    assert planner.matched_tokens("x", hashes, other, 0) == 9
    # A shorter resume than the save (the daemon kept fewer tokens than the engine made).
    assert planner.matched_tokens("y", hashes, tokens[:10], 0) == 9
    # A tail with no whole block before it.
    short = [5, 6, 7]
    planner.finished("s", [], short, 2, [3], offload=True)
    planner.build([])
    assert planner.matched_tokens("s2", [], short, 0) == 2


def test_nothing_is_loaded_without_an_allocation() -> None:
    planner, tokens, hashes = _saved(9, 9)
    assert planner.matched_tokens("new", hashes, tokens, 0) == 8
    planner.allocated("new", 0)  # vLLM could not allocate for the external tokens
    assert planner.build([("new", [5, 6, 7])]).loads == []


def test_evictions_reach_the_worker_before_the_saves_that_replace_them() -> None:
    planner = _planner(capacity_blocks=2)
    first, second = list(range(8)), list(range(50, 58))
    first_hashes, second_hashes = chain_hashes(first, BLOCK), chain_hashes(second, BLOCK)
    planner.finished("a", first_hashes, first, 8, [0, 1], offload=True)
    planner.finished("b", second_hashes, second, 8, [2, 3], offload=True)
    plan = planner.build([])
    assert plan.drops == first_hashes[::-1]
    assert [h for h, _ in plan.saves] == first_hashes + second_hashes


def test_failed_loads_count_the_tokens_vllm_computes_again() -> None:
    # 18 computed tokens: 4 whole blocks and a 2-token tail.
    planner, tokens, hashes = _saved(20, 18)
    assert planner.matched_tokens("new", hashes, tokens[:19], 0) == 18
    planner.allocated("new", 18)
    plan = planner.build([("new", [20, 21, 22, 23, 24])])
    assert [block_id for _, block_id in plan.loads] == [20, 21, 22, 23, 24]
    assert planner.index.counters.loaded_tokens == 18
    # Blocks 22 and 23 fail: vLLM recomputes from block 22 on (2 blocks and the tail);
    # an id that was no load of this plan changes nothing.
    planner.load_failed({23, 22, 99})
    assert planner.load_failed_tokens == 2 * BLOCK + 2
    assert planner.index.counters.loaded_tokens == 2 * BLOCK
    assert planner.index.counters.loaded_bytes == 2 * 10
    planner.build([])
    planner.load_failed({20})  # reported after its step: no longer this plan's
    assert planner.load_failed_tokens == 2 * BLOCK + 2
