"""The connector's worker half on tensors laid out as vLLM's CPU paged cache."""

from __future__ import annotations

import torch

from kvstore.plan import StepPlan
from kvstore.worker import BlockMover


def _mover(quantization: str = "none") -> tuple[BlockMover, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    # [num_blocks, num_kv_heads, block_size, 2 * head_size], two layers
    caches = {f"layer{i}": torch.randn(6, 2, 128, 64) for i in range(2)}
    mover = BlockMover(quantization)  # type: ignore[arg-type]
    mover.register(caches)
    return mover, caches


def test_save_then_load_copies_a_block_across_all_layers() -> None:
    mover, caches = _mover()
    assert mover.block_shape() == (2, 2, 2, 128, 32)
    original = [cache[1].clone() for cache in caches.values()]
    mover.apply(StepPlan(saves=[(b"h", 1)], saving_request_ids=["r"]))
    for cache in caches.values():
        cache[1].zero_()  # the engine reuses the block once the save is reported
    mover.apply(StepPlan(loads=[(b"h", 4)]))
    for cache, block in zip(caches.values(), original, strict=True):
        assert torch.equal(cache[4], block)
    assert mover.take_load_errors() == set()


def test_int8_reload_error_is_bounded_per_channel() -> None:
    mover, caches = _mover("int8")
    original = caches["layer0"][1].clone()
    mover.apply(StepPlan(saves=[(b"h", 1)], loads=[(b"h", 2)]))
    error = (caches["layer0"][2] - original).abs()
    assert 0 < error.max() < 0.03  # randn channels: max |x| ~ 4, half a step ~ 4 / 254


def test_a_missing_entry_is_a_load_error_and_leaves_the_block_alone() -> None:
    mover, caches = _mover()
    before = caches["layer0"][3].clone()
    mover.apply(StepPlan(saves=[(b"h", 1)], drops=[], loads=[(b"gone", 3)]))
    assert mover.take_load_errors() == {3}  # vLLM recomputes from this block
    assert mover.take_load_errors() == set()
    assert torch.equal(caches["layer0"][3], before)


def test_saves_are_reported_once_vllm_has_named_the_request_finished() -> None:
    mover, _ = _mover()
    mover.apply(StepPlan(saves=[(b"h", 1)], saving_request_ids=["r"]))
    assert mover.finished_saves(set()) == set()
    assert mover.finished_saves({"r", "other"}) == {"r"}
    assert mover.finished_saves({"r"}) == set()
