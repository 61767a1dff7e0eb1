"""Proxy training determinism, the serving API on it, and the shipped default predictor."""

from __future__ import annotations

import json

import pytest
import torch

from predictor import PredictInput, default_predictor_path, load_predictor
from predictor.cli import main
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


def test_from_openai_keeps_text_parts() -> None:
    inp = PredictInput.from_openai([{"role": "system", "content": "s"},
                                    {"role": "user", "content": [{"type": "text", "text": "hi"},
                                                                 {"type": "image_url"}]}], 7)
    assert [(m.role, m.content) for m in inp.messages] == [("system", "s"), ("user", "hi")]
    assert inp.num_prompt_tokens == 7


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


def test_eval_cli_prints_the_report(small_train, small_proxy, capsys) -> None:
    assert main(["eval", "--model", str(small_proxy), "--data", str(small_train), "--json",
                 "--limit", "80"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("n", "mae", "rmse", "r2", "acc5", "kendall_tau", "p50_ms", "p99_ms",
                "batch32_ms"):
        assert key in report
    assert set(report["baselines"]) == {"train_mean", "linear_prompt_length"}
    assert report["n"] == 80


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


def test_fused_ensemble_matches_its_members(small_train, tmp_path) -> None:
    out = tmp_path / "ens3"
    assert main(["train", "--kind", "proxy", "--data", str(small_train), "--out", str(out),
                 "--epochs", "1", "--dev-limit", "50", "--limit", "200", "--members", "3"]) == 0
    predictor = load_predictor(out)
    assert predictor.net._fused is not None  # the serving path
    inputs = [PredictInput.from_record(r) for r in list(read_records(small_train))[:16]]
    x = predictor.rows(inputs).batch(range(16))
    with torch.inference_mode():
        fused = predictor.net.forward_all(x)
        plain = torch.stack([m.forward_all(x) for m in predictor.net.members]).mean(0)
    assert fused.shape == (16, 4)
    assert torch.allclose(fused, plain, atol=1e-5)
