"""The regression network shared by the proxy and iterative predictors."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from predictor.netconfig import NetConfig


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
    """`cfg.members` LengthNets on the same inputs; outputs averaged in log space (one set of
    features, so the cost over one net is only the extra bag lookups and MLPs)."""

    def __init__(self, cfg: NetConfig, members: list[LengthNet] | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.members = nn.ModuleList(members or [LengthNet(cfg) for _ in range(cfg.members)])

    def forward(self, x: NetInput) -> torch.Tensor:
        return self.forward_all(x)[:, 0]

    def forward_all(self, x: NetInput) -> torch.Tensor:
        nets: list[LengthNet] = list(self.members)  # type: ignore[arg-type]
        return torch.stack([net.forward_all(x) for net in nets]).mean(0)


Net = LengthNet | LengthEnsemble


def build_net(cfg: NetConfig) -> Net:
    return LengthNet(cfg) if cfg.members == 1 else LengthEnsemble(cfg)
