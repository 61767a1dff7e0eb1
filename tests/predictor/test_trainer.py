"""The training losses: pinball, listwise ranking, and their sum."""

from __future__ import annotations

import pytest
import torch

from predictor.trainer import (
    length_loss,
    listnet_loss,
    pinball_loss,
)


def test_pinball_loss_matches_its_definition() -> None:
    pred = torch.tensor([[1.0, 1.0], [3.0, 3.0]])
    y = torch.tensor([2.0, 2.0])
    # q = 0.5: |err| / 2 on both rows; q = 0.9: under-prediction costs 0.9, over 0.1
    expected = (0.5 + 0.5) / 2 + (0.9 * 1.0 + 0.1 * 1.0) / 2
    assert pinball_loss(pred, y, (0.5, 0.9)).item() == pytest.approx(expected)


def test_listnet_is_shift_invariant_and_prefers_the_true_order() -> None:
    y = torch.tensor([1.0, 3.0, 2.0, 5.0])
    right = listnet_loss(y + 7.0, y)
    assert right.item() == pytest.approx(listnet_loss(y, y).item())
    assert listnet_loss(-y, y).item() > right.item() + 0.5
    s = (y + 7.0).clone().requires_grad_(True)
    listnet_loss(s, y).backward()
    assert s.grad is not None and s.grad.abs().max().item() < 1e-6


def test_length_loss_adds_the_pinball_and_rank_terms() -> None:
    out = torch.tensor([[1.0, 0.5, 2.0], [2.0, 1.5, 3.0], [0.5, 0.0, 1.0]])
    y = torch.tensor([1.2, 1.8, 0.7])
    l1 = length_loss(out, y, 0.0)
    with_q = length_loss(out, y, 0.0, quantiles=(0.5, 0.9))
    with_rank = length_loss(out, y, 1.0, "listnet", quantiles=(0.5, 0.9))
    assert with_q.item() == pytest.approx(l1.item() + pinball_loss(out[:, 1:], y, (0.5, 0.9)).item())
    assert with_rank.item() == pytest.approx(with_q.item() + listnet_loss(out[:, 0], y).item())
