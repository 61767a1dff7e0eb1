"""LengthNet and its ensemble (the fused serving path), and the weights file: float16 on disk,
float32 in memory, non-finite weights refused."""

from __future__ import annotations

import pytest
import torch

from predictor import PredictInput, load_predictor
from predictor.cli import main
from predictor.manifest import NetConfig
from predictor.net import (
    WEIGHTS,
    LengthEnsemble,
    LengthNet,
    NetInput,
    build_net,
    load_net,
    save_net,
)
from predictor.records import read_records

CFG = NetConfig(table_size=40, num_numeric=3, bag_dim=4, hidden=8, quantiles=(0.1, 0.9))


def _input(batch: int, partial: bool = False) -> NetInput:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 40, (3 * batch,), generator=gen)
    offsets = torch.arange(0, 3 * batch, 3)
    x = NetInput(prompt_ids=ids, prompt_offsets=offsets, hist_ids=ids.flip(0),
                 hist_offsets=offsets, numeric=torch.randn(batch, 3, generator=gen))
    if partial:
        x.out_ids, x.out_offsets = ids, offsets
    return x


def test_outputs_point_then_quantiles() -> None:
    net = build_net(CFG).eval()
    assert isinstance(net, LengthNet)
    with torch.inference_mode():
        out = net.forward_all(_input(5))
        assert out.shape == (5, 3) and torch.equal(net(_input(5)), out[:, 0])
    partial = LengthNet(NetConfig(table_size=40, num_numeric=3, bag_dim=4, hidden=8,
                                  partial=True)).eval()
    assert partial(_input(2, partial=True)).shape == (2,)


def test_fused_ensemble_matches_the_mean_of_its_members() -> None:
    torch.manual_seed(0)
    net = build_net(NetConfig(table_size=40, num_numeric=3, bag_dim=4, hidden=8,
                              quantiles=(0.5,), members=3)).eval()
    assert isinstance(net, LengthEnsemble)
    with torch.inference_mode():
        plain = net.forward_all(_input(6))
        net.fuse()
        assert torch.allclose(net.forward_all(_input(6)), plain, atol=1e-6)
        each = torch.stack([m.forward_all(_input(6)) for m in net.members])
        assert torch.allclose(plain, each.mean(0))


def test_weights_are_stored_half_and_loaded_float(tmp_path) -> None:
    net = build_net(CFG)
    net.num_mean.fill_(0.123456789)
    save_net(net, tmp_path)
    state = torch.load(tmp_path / WEIGHTS, weights_only=True)
    assert state["table.weight"].dtype == state["mlp.0.weight"].dtype == torch.float16
    assert state["num_mean"].dtype == torch.float32  # buffers stay exact
    loaded = load_net(CFG, tmp_path)
    assert not loaded.training and loaded.num_mean[0].item() == net.num_mean[0].item()
    for key, value in loaded.state_dict().items():
        assert value.dtype == torch.float32
        assert torch.allclose(value, net.state_dict()[key], atol=1e-3)
    assert not (tmp_path / (WEIGHTS + ".tmp")).exists()


def test_non_finite_weights_are_refused(tmp_path) -> None:
    net = build_net(CFG)
    with torch.no_grad():
        net.mlp[0].weight[0, 0] = float("nan")
    save_net(net, tmp_path)
    with pytest.raises(ValueError, match="non-finite weights in mlp.0.weight"):
        load_net(CFG, tmp_path)


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
