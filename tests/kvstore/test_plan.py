"""The connector's scheduler half, without an engine."""

from __future__ import annotations

from kvstore.plan import Planner, wants_offload
from kvstore.store import BlockIndex, chain_hashes

BLOCK = 4


def _planner(capacity_blocks: int = 16) -> Planner:
    return Planner(BlockIndex(capacity_blocks * 10, BLOCK, 10))


def test_offload_flag() -> None:
    assert wants_offload({"kvstore": "offload"})
    assert not wants_offload(None) and not wants_offload({"kvstore": "drop"})


def test_finished_request_saves_only_computed_whole_blocks() -> None:
    planner = _planner()
    hashes = chain_hashes(list(range(14)), BLOCK)  # 3 full blocks of 14 tokens
    # 13 tokens computed (the last generated token has no KV yet): 3 whole blocks.
    assert planner.finished("a", hashes, 13, [7, 8, 9, 10], offload=True) == 3 * BLOCK
    assert planner.finished("b", hashes, 13, [1, 2, 3, 4], offload=False) == 0
    plan = planner.build([])
    assert plan.saves == list(zip(hashes, [7, 8, 9], strict=True))
    assert plan.saving_request_ids == ["a"] and plan.step == 1
    assert planner.build([]).saves == []  # each decision is sent once


def test_matched_tokens_leave_one_token_to_compute_and_start_after_local_hits() -> None:
    planner = _planner()
    tokens = list(range(12))
    hashes = chain_hashes(tokens, BLOCK)
    planner.finished("old", hashes, 12, [0, 1, 2], offload=True)
    planner.build([])
    # 12 tokens, all 3 blocks stored: the last block must still be computed.
    assert planner.matched_tokens("new", hashes, 12, 0) == 8
    assert planner.matched_tokens("new", hashes, 12, 4) == 4  # block 0 hit vLLM's own cache
    planner.allocated("new", 4)
    plan = planner.build([("new", [20, 21, 22])])
    assert plan.loads == [(hashes[1], 21)]
    assert planner.index.counters.loaded_tokens == BLOCK


def test_nothing_is_loaded_without_an_allocation() -> None:
    planner = _planner()
    hashes = chain_hashes(list(range(9)), BLOCK)
    planner.finished("old", hashes, 9, [0, 1], offload=True)
    planner.build([])
    assert planner.matched_tokens("new", hashes, 9, 0) == 8
    planner.allocated("new", 0)  # vLLM could not allocate for the external tokens
    assert planner.build([("new", [5, 6, 7])]).loads == []


def test_evictions_reach_the_worker_before_the_saves_that_replace_them() -> None:
    planner = _planner(capacity_blocks=2)
    first = chain_hashes(list(range(8)), BLOCK)
    second = chain_hashes(list(range(50, 58)), BLOCK)
    planner.finished("a", first, 8, [0, 1], offload=True)
    planner.finished("b", second, 8, [2, 3], offload=True)
    plan = planner.build([])
    assert plan.drops == first[::-1] and [h for h, _ in plan.saves] == first + second


def test_failed_loads_count_the_tokens_vllm_computes_again() -> None:
    planner = _planner()
    tokens = list(range(17))
    hashes = chain_hashes(tokens, BLOCK)  # 4 whole blocks
    planner.finished("old", hashes, 17, [0, 1, 2, 3], offload=True)
    planner.build([])
    assert planner.matched_tokens("new", hashes, 17, 0) == 16
    planner.allocated("new", 16)
    plan = planner.build([("new", [20, 21, 22, 23, 24])])
    assert [block_id for _, block_id in plan.loads] == [20, 21, 22, 23]
    assert planner.index.counters.loaded_tokens == 4 * BLOCK
    # Blocks 22 and 23 fail: vLLM recomputes from block 22 on (2 blocks); an id that was
    # no load of this plan changes nothing.
    planner.load_failed({23, 22, 99})
    assert planner.load_failed_tokens == 2 * BLOCK
    assert planner.index.counters.loaded_tokens == 2 * BLOCK
    planner.build([])
    planner.load_failed({20})  # reported after its step: no longer this plan's
    assert planner.load_failed_tokens == 2 * BLOCK
