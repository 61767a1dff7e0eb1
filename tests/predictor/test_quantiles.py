"""The distributional head (quantile outputs), the listwise ranking loss, and the eval report's
calibration figures."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from predictor import PredictInput, load_predictor
from predictor.cli import main
from predictor.evaluate import coverage
from predictor.proxy import conformal_offsets, quantile_tokens, shifted
from predictor.records import read_records
from predictor.trainer import length_loss, listnet_loss, pinball_loss


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


def test_quantile_tokens_interpolates_in_log_space_and_refuses_extrapolation() -> None:
    out = np.log1p(np.asarray([[0.0, 10.0, 100.0, 1000.0]]))
    got = quantile_tokens(out, (0.1, 0.5, 0.9), (0.5, 0.9, 0.7))
    assert got[0, 0] == pytest.approx(100.0) and got[0, 1] == pytest.approx(1000.0)
    assert 100.0 < got[0, 2] < 1000.0
    with pytest.raises(ValueError):
        quantile_tokens(out, (0.1, 0.5, 0.9), (0.95,))
    with pytest.raises(NotImplementedError):
        quantile_tokens(out[:, :1], (), (0.5,))
    assert coverage(np.asarray([5.0, 5.0]), np.asarray([4.0, 6.0])) == 0.5


def test_trained_proxy_gives_ordered_quantiles(small_train, small_proxy) -> None:
    predictor = load_predictor(small_proxy)
    records = list(read_records(small_train))[:20]
    inputs = [PredictInput.from_record(r) for r in records]
    quant = predictor.predict_quantiles(inputs, (0.1, 0.5, 0.9))
    assert len(quant) == 20 and all(len(q) == 3 for q in quant)
    assert all(1.0 <= a <= b <= c for a, b, c in quant)
    assert any(c > a for a, _, c in quant)  # a spread, not a point
    assert predictor.predict_quantiles([]) == []
    with pytest.raises(ValueError):
        predictor.predict_quantiles(inputs[:1], (0.99,))
    # the point estimate is unchanged by the quantile head
    assert predictor.predict(inputs[:3]) == predictor.predict(inputs[:3])


def test_eval_reports_coverage_and_the_tail_cut(small_train, small_proxy, capsys) -> None:
    assert main(["eval", "--model", str(small_proxy), "--data", str(small_train), "--json",
                 "--limit", "120"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0.0 <= report["coverage_p50"] <= report["coverage_p90"] <= 1.0
    assert "coverage_p90" in report["by_round"]["first"]
    cut = report["within_2048"]
    assert cut["n"] + cut["dropped"] == 120 and cut["n"] > 0


def test_model_without_quantiles_says_so(small_train, tmp_path) -> None:
    out = tmp_path / "point"
    assert main(["train", "--kind", "proxy", "--data", str(small_train), "--out", str(out),
                 "--epochs", "1", "--dev-limit", "50", "--limit", "200", "--quantiles", ""]) == 0
    predictor = load_predictor(out)
    inp = PredictInput.from_openai([{"role": "user", "content": "hi"}])
    assert predictor.predict([inp])[0] >= 1.0
    with pytest.raises(NotImplementedError):
        predictor.predict_quantiles([inp])


def test_listnet_objective_trains(small_train, tmp_path) -> None:
    out = tmp_path / "listnet"
    assert main(["train", "--kind", "proxy", "--data", str(small_train), "--out", str(out),
                 "--epochs", "1", "--dev-limit", "50", "--limit", "200", "--rank-loss",
                 "listnet", "--rank-weight", "1"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert "coverage_p90" in manifest["dev_metrics"]
    assert "first_kendall_tau" in manifest["dev_metrics"]


def test_conformal_offsets_restore_coverage() -> None:
    rng = np.random.default_rng(0)
    log_true = rng.normal(5.0, 1.0, 4000)
    centre = log_true + rng.normal(0.0, 0.5, 4000)  # an informative but noisy point estimate
    # quantiles far too narrow (as off the training set): +-0.1 around the centre
    outputs = np.stack([centre, centre - 0.1, centre, centre + 0.1], axis=1)
    true = np.expm1(log_true)
    levels = (0.1, 0.5, 0.9)
    raw = quantile_tokens(outputs, levels, (0.9,))[:, 0]
    assert coverage(raw, true) < 0.65
    offsets = conformal_offsets(outputs[:2000], levels, true[:2000])
    assert offsets[0] < 0 < offsets[2]
    fixed = quantile_tokens(shifted(outputs[2000:], offsets), levels, (0.5, 0.9))
    assert abs(coverage(fixed[:, 1], true[2000:]) - 0.9) < 0.03  # held-out rows
    assert abs(coverage(fixed[:, 0], true[2000:]) - 0.5) < 0.04
    assert conformal_offsets(outputs[:50], levels, true[:50]) == []  # too few rows to fit
