from __future__ import annotations

import pytest
import torch

from kvstore.quant import dequantize, encoded_nbytes, quantize


def test_int8_round_trip_error_is_at_most_half_a_step_per_channel() -> None:
    torch.manual_seed(0)
    # [heads, K|V, tokens, head_size] with one outlier channel 100x the others
    block = torch.randn(2, 2, 128, 32)
    block[..., 5] *= 100.0
    quantized, scales = quantize(block)
    assert quantized.dtype == torch.int8 and scales.shape == (2, 2, 1, 32)
    restored = dequantize(quantized, scales, torch.float32)
    error = (restored - block).abs()
    assert torch.all(error <= scales / 2 + 1e-6)
    # The outlier does not cost the other channels their precision.
    others = torch.cat([error[..., :5], error[..., 6:]], dim=-1)
    assert others.max() < 0.05 * block[..., 5].abs().max() / 100


def test_zero_channels_round_trip_exactly() -> None:
    quantized, scales = quantize(torch.zeros(1, 2, 128, 8))
    assert torch.equal(dequantize(quantized, scales, torch.bfloat16),
                       torch.zeros(1, 2, 128, 8, dtype=torch.bfloat16))


@pytest.mark.parametrize(("dtype", "ratio"), [(torch.bfloat16, 0.5 + 2 / 128),
                                              (torch.float32, 0.25 + 1 / 128)])
def test_int8_bytes_per_token_against_the_engine_dtype(dtype: torch.dtype, ratio: float) -> None:
    shape = (30, 3, 2, 128, 64)  # SmolLM2: 30 layers, 3 KV heads of 64, 128-token blocks
    plain = encoded_nbytes(shape, dtype, "none")
    assert plain == 30 * 3 * 2 * 128 * 64 * dtype.itemsize
    assert encoded_nbytes(shape, dtype, "int8") / plain == pytest.approx(ratio)
    assert encoded_nbytes(shape, dtype, "int8") <= 0.55 * plain  # issue 12's target
    quantized, scales = quantize(torch.ones(shape, dtype=dtype))
    assert quantized.nbytes + scales.nbytes == encoded_nbytes(shape, dtype, "int8")
