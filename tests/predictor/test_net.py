"""An ensemble's fused serving path matches its members."""

from __future__ import annotations

import torch

from predictor import PredictInput, load_predictor
from predictor.cli import main
from predictor.records import read_records


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
