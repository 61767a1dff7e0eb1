"""SCLS's batching: DP batches by input length (against brute force) under the memory
estimate, max-min offloading, the adaptive interval (Eq. 10-12)."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.config import SimConfig
from daemon.core.costmodel import CostModel
from policies.scls_batching import dp_batches, max_min_assign, next_interval

COST = CostModel.from_sim(SimConfig())


def serve(size: int, length: int) -> float:
    return COST.batch_serve_s(size, length, 128)


def brute_force(lengths: list[int], max_batch: int, cap: int) -> float:
    @cache
    def best(i: int) -> float:  # min total time for lengths[:i]
        if i == 0:
            return 0.0
        options = []
        for start in range(i):
            size = i - start
            if size == 1 or (size <= max_batch and (lengths[i - 1] + 128) * size <= cap):
                options.append(best(start) + serve(size, lengths[i - 1]))
        return min(options)
    return best(len(lengths))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(lengths=st.lists(st.integers(1, 2000), min_size=1, max_size=12),
       max_batch=st.integers(1, 6), cap=st.integers(100, 20_000))
def test_dp_batching_is_optimal_and_respects_memory(lengths: list[int], max_batch: int,
                                                    cap: int) -> None:
    lengths.sort()

    def fits(size: int, length: int) -> bool:
        return size <= max_batch and (length + 128) * size <= cap

    batches = dp_batches(lengths, serve, fits)
    assert [i for b in batches for i in b] == list(range(len(lengths)))
    assert all(len(b) == 1 or fits(len(b), lengths[b[-1]]) for b in batches)
    total = sum(serve(len(b), lengths[b[-1]]) for b in batches)
    assert total == pytest.approx(brute_force(lengths, max_batch, cap))


def test_dp_separates_one_long_input_from_many_short_ones() -> None:
    """The paper's Fig. 11: 15 inputs of 10 tokens and one of 1024, slice 128, on an engine
    where padding is expensive (HF-like per-token costs); on the default sim cost model,
    whose steps are dominated by fixed costs, batching all 16 together is cheaper."""
    padded = CostModel(0.01, 1e-4, 0.008, 0.0005, 2e-5)
    lengths = [10] * 15 + [1024]

    def fits(size: int, length: int) -> bool:
        return size <= 16

    batches = dp_batches(lengths, lambda n, li: padded.batch_serve_s(n, li, 128), fits)
    assert [len(b) for b in batches] == [15, 1]
    assert [len(b) for b in dp_batches(lengths, serve, fits)] == [16]
    with pytest.raises(ValueError):
        dp_batches([5, 3], serve, lambda size, length: True)


def test_max_min_gives_the_longest_batch_to_the_least_loaded() -> None:
    # 5 -> a (0 < 2); 3 -> b (2 < 5); 1 -> a (5 = 5: the first named).
    assert max_min_assign([1.0, 5.0, 3.0], {"a": 0.0, "b": 2.0}) == ["a", "a", "b"]
    assert max_min_assign([], {"a": 0.0}) == []
    assert next_interval({"a": 4.0, "b": 10.0}, 0.5, 1.0) == 2.0
    assert next_interval({"a": 0.5}, 0.5, 1.0) == 1.0
