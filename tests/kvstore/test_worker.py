"""The connector's worker half on tensors laid out as vLLM's CPU paged cache."""

from __future__ import annotations

import pytest
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


def _written_by_the_engine_op(keys: torch.Tensor, values: torch.Tensor
                              ) -> dict[str, torch.Tensor]:
    """One layer of 4 blocks, block 1 holding `keys`/`values` [tokens, heads, head_size]
    written by vLLM's own CPU cache write, in the layout of the ISA vLLM picks here."""
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    tokens, heads, head_size = keys.shape
    cache = torch.zeros(4, heads, tokens, 2 * head_size, dtype=keys.dtype)
    key_cache, value_cache = cache.view(4, heads, 2 * tokens, head_size).chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(keys, values, key_cache, value_cache,
                                   torch.arange(tokens, 2 * tokens),
                                   _get_attn_isa(keys.dtype, tokens, head_size))
    return {"layer0": cache}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_scales_are_per_channel_in_the_engine_layout(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    keys, values = torch.randn(2, 128, 2, 64).to(dtype)  # [tokens, heads, head_size]
    keys[..., 7] *= 100.0  # one channel 100x the others over every token, in K and in V
    values[..., 7] *= 100.0
    caches = _written_by_the_engine_op(keys, values)
    mover = BlockMover("int8")
    mover.register(caches)
    mover.apply(StepPlan(saves=[(b"h", 1)], loads=[(b"h", 2)]))
    # Stored token-major: [layers, heads, K|V, tokens, head_size].
    stored = mover.data.get(b"h", dtype)
    assert stored is not None
    want = torch.stack([keys, values]).permute(2, 0, 1, 3)  # [heads, K|V, tokens, c]
    error = (stored[0].float() - want.float()).abs()
    # The outlier costs only its own channel: a scale shared with it (any grouping that
    # mixes channel 7 into the others' groups) would err by ~400 / 254 on them.
    others = torch.cat([error[..., :7], error[..., 8:]], dim=-1)
    assert others.max() < 0.05
    assert error[..., 7].max() < 2.0
    # And the load put every element back where the kernel reads it: block 2 is what the
    # engine's own write of the stored K and V gives.
    stored_keys, stored_values = stored[0].permute(1, 2, 0, 3)  # [tokens, heads, c] each
    again = _written_by_the_engine_op(stored_keys.contiguous(), stored_values.contiguous())
    assert torch.equal(caches["layer0"][2], again["layer0"][1])


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
