"""Fitting LengthNets: the losses (L1, pinball, listwise and pairwise ranking), deterministic
training, calibration and the sorted outputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from predictor.features import FeatureRows
from predictor.manifest import NetConfig
from predictor.net import LengthEnsemble, LengthNet
from predictor.trainer import (
    TrainConfig,
    all_outputs,
    calibration,
    fit,
    fit_members,
    length_loss,
    listnet_loss,
    pairwise_rank_loss,
    pinball_loss,
    scores,
    sort_quantiles,
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


def test_pairwise_rank_loss_ignores_ties_and_prefers_the_true_order() -> None:
    y = torch.tensor([1.0, 2.0, 3.0])
    assert pairwise_rank_loss(torch.tensor([5.0, 1.0, 2.0]), torch.ones(3)).item() == 0.0
    assert pairwise_rank_loss(y, y).item() < pairwise_rank_loss(-y, y).item()


def _rows(n: int, rng: np.random.Generator) -> tuple[FeatureRows, np.ndarray]:
    """Rows whose log target is a linear function of the first numeric feature."""
    numeric = rng.normal(size=(n, 3)).astype(np.float32)
    bags = [rng.integers(0, 50, size=4) for _ in range(n)]
    return FeatureRows(prompt_bags=bags, hist_bags=bags, numeric=numeric), 3.0 + numeric[:, 0]


def test_fit_is_deterministic_and_learns() -> None:
    rows, y = _rows(128, np.random.default_rng(0))
    cfg = NetConfig(table_size=50, num_numeric=3, bag_dim=4, hidden=16, quantiles=(0.1, 0.9))
    tc = TrainConfig(epochs=15, batch_size=32, lr=1e-2)
    a, b = fit(cfg, rows, y, tc), fit(cfg, rows, y, tc)
    assert isinstance(a, LengthNet) and not a.training
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    assert np.mean(np.abs(scores(a, rows) - y)) < 0.5 * np.mean(np.abs(y - np.median(y)))
    out = all_outputs(a, rows, batch_size=50)
    assert out.shape == (128, 3) and np.all(np.diff(out[:, 1:], axis=1) >= 0)
    assert all_outputs(a, FeatureRows([], [], np.zeros((0, 3), np.float32))).shape == (0, 3)


def test_fit_members_seeds_each_member_apart() -> None:
    rows, y = _rows(32, np.random.default_rng(1))
    cfg = NetConfig(table_size=50, num_numeric=3, bag_dim=4, hidden=8, members=2)
    net = fit_members(cfg, rows, y, TrainConfig(epochs=1, batch_size=16))
    assert isinstance(net, LengthEnsemble) and len(net.members) == 2
    first, second = (m.state_dict()["mlp.0.weight"] for m in net.members)
    assert not torch.equal(first, second)


def test_calibration_is_the_least_squares_scale() -> None:
    lengths = np.asarray([10.0, 20.0, 30.0])
    assert calibration(np.log1p(lengths), 2.0 * lengths) == pytest.approx(2.0)
    assert calibration(np.zeros(3), lengths) == 0.0  # all-zero predictions: no division by 0


def test_sort_quantiles_sorts_only_the_quantile_columns() -> None:
    out = np.asarray([[5.0, 3.0, 1.0, 2.0]])
    assert sort_quantiles(out).tolist() == [[5.0, 1.0, 2.0, 3.0]]
    assert out.tolist() == [[5.0, 3.0, 1.0, 2.0]]  # a copy
