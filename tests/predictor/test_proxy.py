"""Proxy predictor: training determinism, the serving API on it, the frozen-encoder option,
ensembles, the quantile head (conformal shifts, interpolation), and the shipped default."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from predictor import PredictInput, default_predictor_path, load_predictor
from predictor.cli import main
from predictor.evaluate import coverage
from predictor.proxy import conformal_offsets, quantile_tokens, shifted
from predictor.records import read_records


def _weights(folder) -> dict[str, torch.Tensor]:
    return torch.load(folder / "net.pt", weights_only=True)


def test_training_is_deterministic(small_train, small_proxy, tmp_path) -> None:
    again = tmp_path / "again"
    assert main(["train", "--kind", "proxy", "--data", str(small_train), "--out", str(again),
                 "--epochs", "2", "--seed", "1", "--dev-limit", "100"]) == 0
    a, b = _weights(small_proxy), _weights(again)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    other = tmp_path / "other"
    assert main(["train", "--kind", "proxy", "--data", str(small_train), "--out", str(other),
                 "--epochs", "2", "--seed", "2", "--dev-limit", "100"]) == 0
    assert not torch.equal(a["mlp.0.weight"], _weights(other)["mlp.0.weight"])


def test_api_on_trained_proxy(small_train, small_proxy) -> None:
    predictor = load_predictor(str(small_proxy))
    assert predictor.kind == "proxy"
    inputs = [PredictInput.from_record(r) for r in list(read_records(small_train))[:5]]
    totals = predictor.predict(inputs)
    assert len(totals) == 5 and all(t >= 1.0 for t in totals)
    assert predictor.predict([]) == []
    remaining = predictor.predict_remaining([(inputs[0], "x" * 400)])
    assert 1.0 <= remaining[0] <= max(1.0, totals[0])
    predictor.observe(inputs[0], 10)  # no-op for the proxy
    predictor.save()


def test_default_predictor_ships_and_ranks_sensibly() -> None:
    predictor = load_predictor(default_predictor_path())
    short = PredictInput.from_openai([{"role": "user", "content": "Reply with one word: yes or no?"}])
    long = PredictInput.from_openai([{"role": "user", "content":
                                      "Write a detailed 2000-word essay on the history of Rome, "
                                      "with sections, examples and a bibliography."}])
    p_short, p_long = predictor.predict([short, long])
    assert p_short < p_long
    (s50, s90), (l50, l90) = predictor.predict_quantiles([short, long])
    assert s50 < s90 and l50 < l90 and s90 < l90
    assert predictor.manifest.net.members == 3 and len(predictor.manifest.quantile_offsets) == 3


def test_frozen_encoder_option_trains_and_serves(small_train, tmp_path) -> None:
    """The real all-MiniLM-L6-v2 (from its package, offline) as an extra input."""
    out = tmp_path / "enc"
    assert main(["train", "--kind", "proxy", "--data", str(small_train), "--out", str(out),
                 "--use-encoder", "--encoder-max-tokens", "128", "--limit", "48",
                 "--dev-limit", "16", "--epochs", "1", "--cache-dir", ""]) == 0
    predictor = load_predictor(out)
    assert predictor.encoder is not None and predictor.encoder.dim == 384
    inputs = [PredictInput.from_record(r) for r in list(read_records(small_train))[:3]]
    assert all(p >= 1.0 for p in predictor.predict(inputs))


def test_ensemble_of_members_averages_their_outputs(small_train, tmp_path) -> None:
    out = tmp_path / "ens"
    assert main(["train", "--kind", "proxy", "--data", str(small_train), "--out", str(out),
                 "--epochs", "1", "--dev-limit", "50", "--limit", "200", "--members", "2",
                 "--seed", "3"]) == 0
    state = _weights(out)
    assert state["members.0.table.weight"].dtype == torch.float16
    assert not torch.equal(state["members.0.mlp.0.weight"], state["members.1.mlp.0.weight"])
    predictor = load_predictor(out)
    inputs = [PredictInput.from_record(r) for r in list(read_records(small_train))[:4]]
    x = predictor.rows(inputs).batch(range(4))
    with torch.inference_mode():
        each = [m.forward_all(x) for m in predictor.net.members]
        assert torch.allclose(predictor.net.forward_all(x), (each[0] + each[1]) / 2)
    cal = predictor.manifest.calibration
    mean = ((each[0][:, 0] + each[1][:, 0]) / 2).double()
    expected = [max(1.0, cal * float(torch.expm1(v))) for v in mean]
    assert predictor.predict(inputs) == pytest.approx(expected, rel=1e-4)


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
    # what the daemon asks (memory admission): both from one pass, the same numbers
    points, upper = predictor.predict_with_upper(inputs, 0.9)
    assert points == pytest.approx(predictor.predict(inputs))
    assert upper == pytest.approx([c for _, _, c in quant])
    assert predictor.predict_with_upper(inputs[:1], 0.99)[1] is None  # outside: none


def test_model_without_quantiles_says_so(small_train, tmp_path) -> None:
    out = tmp_path / "point"
    assert main(["train", "--kind", "proxy", "--data", str(small_train), "--out", str(out),
                 "--epochs", "1", "--dev-limit", "50", "--limit", "200", "--quantiles", ""]) == 0
    predictor = load_predictor(out)
    inp = PredictInput.from_openai([{"role": "user", "content": "hi"}])
    assert predictor.predict([inp])[0] >= 1.0
    with pytest.raises(NotImplementedError):
        predictor.predict_quantiles([inp])
    assert predictor.predict_with_upper([inp], 0.9)[1] is None


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


def test_shifted_adds_the_offsets_and_keeps_the_quantiles_sorted() -> None:
    out = np.asarray([[1.0, 0.5, 1.0, 1.5]])
    assert shifted(out, []) is out
    assert shifted(out, [0.0, -1.0, 0.0]).tolist() == [[1.0, 0.0, 0.5, 1.5]]
