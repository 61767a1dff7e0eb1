"""LengthNet, the regression network shared by the proxy and iterative predictors, its
ensemble, and its weights file (float16 on disk, float32 in memory)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from torch import nn

from predictor.manifest import NetConfig


@dataclass(slots=True)
class NetInput:
    prompt_ids: torch.Tensor
    prompt_offsets: torch.Tensor
    hist_ids: torch.Tensor
    hist_offsets: torch.Tensor
    numeric: torch.Tensor  # [B, num_numeric], raw (the net standardises)
    emb: torch.Tensor | None = None  # [B, emb_dim]
    out_ids: torch.Tensor | None = None
    out_offsets: torch.Tensor | None = None


class LengthNet(nn.Module):
    """Bags (prompt, history, partial answer) + numerics + embedding -> MLP -> log1p(tokens).

    Output column 0 is the point estimate (L1: a log-median); columns 1.. are the quantiles
    `cfg.quantiles` of log1p(tokens) (pinball loss), when the config asks for them."""

    num_mean: torch.Tensor
    num_std: torch.Tensor
    target_bias: torch.Tensor

    def __init__(self, cfg: NetConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.table = nn.EmbeddingBag(cfg.table_size, cfg.bag_dim, mode="mean")
        nn.init.normal_(self.table.weight, std=0.05)
        num_bags = 3 if cfg.partial else 2
        width = num_bags * cfg.bag_dim + cfg.num_numeric + cfg.emb_dim
        self.mlp = nn.Sequential(
            nn.Linear(width, cfg.hidden), nn.GELU(), nn.Dropout(cfg.dropout),
            nn.Linear(cfg.hidden, cfg.hidden // 2), nn.GELU(), nn.Linear(cfg.hidden // 2, 1 + len(cfg.quantiles)))
        self.register_buffer("num_mean", torch.zeros(cfg.num_numeric))
        self.register_buffer("num_std", torch.ones(cfg.num_numeric))
        self.register_buffer("target_bias", torch.zeros(()))  # mean log length: eases training

    def forward(self, x: NetInput) -> torch.Tensor:
        """Point estimate of log1p(tokens), [B]."""
        return self.forward_all(x)[:, 0]

    def forward_all(self, x: NetInput) -> torch.Tensor:
        """[B, 1 + len(quantiles)]: point estimate, then the quantiles (unsorted)."""
        return self.mlp(self._inputs(x)) + self.target_bias

    def _inputs(self, x: NetInput) -> torch.Tensor:
        parts = [self.table(x.prompt_ids, x.prompt_offsets),
                 self.table(x.hist_ids, x.hist_offsets)]
        if self.cfg.partial:
            parts.append(self.table(x.out_ids, x.out_offsets))
        parts.append((x.numeric - self.num_mean) / self.num_std)
        if self.cfg.emb_dim:
            parts.append(x.emb)
        return torch.cat(parts, dim=-1)


class LengthEnsemble(nn.Module):
    """`cfg.members` LengthNets on the same inputs; outputs averaged in log space. For
    serving, `fuse()` stacks the members' tables and MLPs so that one bag lookup per text and
    one batched matmul per layer serve all of them (same outputs, fewer torch calls)."""

    def __init__(self, cfg: NetConfig, members: list[LengthNet] | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.members = nn.ModuleList(members or [LengthNet(cfg) for _ in range(cfg.members)])
        self._fused: _Fused | None = None

    def forward(self, x: NetInput) -> torch.Tensor:
        return self.forward_all(x)[:, 0]

    def forward_all(self, x: NetInput) -> torch.Tensor:
        if self._fused is not None and not self.training:
            return self._fused(x)
        nets: list[LengthNet] = list(self.members)  # type: ignore[arg-type]
        return torch.stack([net.forward_all(x) for net in nets]).mean(0)

    def fuse(self) -> None:
        """Freeze the current weights into the fused serving path (call after loading)."""
        self._fused = _Fused(list(self.members))  # type: ignore[arg-type]


class _Fused:
    """The members' tables side by side ([V, K*D]) and their layers as [K, in, out] stacks."""

    def __init__(self, nets: list[LengthNet]) -> None:
        first = nets[0]
        self.cfg, self.k = first.cfg, len(nets)
        with torch.no_grad():
            table = torch.cat([n.table.weight for n in nets], dim=1)
            self.table = nn.EmbeddingBag.from_pretrained(table, mode="mean", freeze=True)
            self.layers = []
            for i in (0, 3, 5):  # the Linear layers of LengthNet.mlp
                linears = [cast(nn.Linear, n.mlp[i]) for n in nets]
                self.layers.append((torch.stack([lin.weight.t() for lin in linears]),
                                    torch.stack([lin.bias for lin in linears]).unsqueeze(1)))
            self.num_mean = torch.stack([n.num_mean for n in nets]).unsqueeze(1)
            self.num_std = torch.stack([n.num_std for n in nets]).unsqueeze(1)
            self.bias = torch.stack([n.target_bias for n in nets]).view(-1, 1, 1)

    def __call__(self, x: NetInput) -> torch.Tensor:
        b, d = x.numeric.shape[0], self.cfg.bag_dim
        bags = [self.table(x.prompt_ids, x.prompt_offsets), self.table(x.hist_ids, x.hist_offsets)]
        if self.cfg.partial:
            bags.append(self.table(x.out_ids, x.out_offsets))
        parts = [bag.view(b, self.k, d).transpose(0, 1) for bag in bags]  # [K, B, D] each
        parts.append((x.numeric.unsqueeze(0) - self.num_mean) / self.num_std)
        if self.cfg.emb_dim:
            assert x.emb is not None
            parts.append(x.emb.unsqueeze(0).expand(self.k, -1, -1))
        h = torch.cat(parts, dim=-1)
        (w0, b0), (w1, b1), (w2, b2) = self.layers
        h = torch.nn.functional.gelu(torch.baddbmm(b0, h, w0))
        h = torch.nn.functional.gelu(torch.baddbmm(b1, h, w1))
        return (torch.baddbmm(b2, h, w2) + self.bias).mean(0)


Net = LengthNet | LengthEnsemble


def build_net(cfg: NetConfig) -> Net:
    return LengthNet(cfg) if cfg.members == 1 else LengthEnsemble(cfg)


WEIGHTS = "net.pt"


def _halved(key: str) -> bool:
    """Weights stored float16: the bag table and the MLP (of each member)."""
    return key.split("members.", 1)[-1].lstrip("0123456789.").startswith(("table", "mlp"))


def save_net(net: Net, folder: Path) -> None:
    state = {k: (v.half() if v.is_floating_point() and v.dim() > 0 and _halved(k) else v)
             for k, v in net.state_dict().items()}
    tmp = folder / (WEIGHTS + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, folder / WEIGHTS)


def load_net(cfg: NetConfig, folder: Path) -> Net:
    net = build_net(cfg)
    state = torch.load(folder / WEIGHTS, map_location="cpu", weights_only=True)
    bad = [k for k, v in state.items() if v.is_floating_point() and not bool(v.isfinite().all())]
    if bad:
        raise ValueError(f"{folder / WEIGHTS}: non-finite weights in {', '.join(bad)}")
    net.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    if isinstance(net, LengthEnsemble):
        net.fuse()
    return net.eval()
