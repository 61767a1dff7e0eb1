"""ALISE's channel-wise INT8 compression of KV blocks.

A block is viewed as `[..., tokens, channels]`; each channel gets one float32 scale (its
absolute maximum over the block's tokens / 127), so an outlier channel costs precision only
to itself. The round-trip error of an element is at most half its channel's scale.
"""

from __future__ import annotations

from typing import Literal

import torch

Quantization = Literal["int8", "none"]
QUANTIZATIONS: tuple[Quantization, ...] = ("int8", "none")

_INT8_MAX = 127.0
# A channel that is zero over all its tokens still needs a finite, nonzero scale.
_MIN_SCALE = 1e-12


def quantize(block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`block` [..., tokens, channels] -> (int8 values, float32 scales [..., 1, channels])."""
    values = block.float()
    scales = (values.abs().amax(dim=-2, keepdim=True) / _INT8_MAX).clamp_min(_MIN_SCALE)
    quantized = torch.round(values / scales).clamp_(-_INT8_MAX, _INT8_MAX).to(torch.int8)
    return quantized, scales


def dequantize(quantized: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype
               ) -> torch.Tensor:
    return (quantized.float() * scales).to(dtype)


def encoded_nbytes(shape: tuple[int, ...], dtype: torch.dtype, quantization: Quantization) -> int:
    """Bytes one block of `shape` [..., tokens, channels] and `dtype` takes once encoded."""
    elements = 1
    for size in shape:
        elements *= size
    if quantization == "none":
        return elements * dtype.itemsize
    tokens = shape[-2]
    return elements + (elements // tokens) * 4  # int8 values + one float32 per channel
