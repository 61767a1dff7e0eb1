"""Fitting LengthNets: the training losses on log length -- L1 (SSJF), pinball for the
quantile outputs, an optional ranking term, pairwise (RankNet) or listwise (ListNet over the
batch) -- and deterministic mini-batch training (seeded shuffles, single thread)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from predictor.features import FeatureRows
from predictor.manifest import NetConfig
from predictor.net import LengthEnsemble, LengthNet, Net

RANK_LOSSES = ("pairwise", "listnet")


def pairwise_rank_loss(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """RankNet logistic loss over all ordered pairs in the batch: SJF needs order, not values."""
    diff_t = targets.unsqueeze(1) - targets.unsqueeze(0)
    diff_s = scores.unsqueeze(1) - scores.unsqueeze(0)
    mask = diff_t > 0.05  # ignore near-ties (in log space: under ~5 %)
    if not bool(mask.any()):
        return scores.sum() * 0.0
    return F.softplus(-diff_s[mask]).mean()


def listnet_loss(scores: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
                 ) -> torch.Tensor:
    """ListNet (top-one probabilities): cross-entropy between the batch softmax of the true
    log lengths and that of the scores (vllm-ltr trains its predictor with a listwise loss).
    Both are divided by `temperature`; the loss is zero-gradient only when the two
    softmaxes agree, i.e. when scores = targets + a constant."""
    p_true = torch.softmax(targets / temperature, dim=0)
    return -(p_true * torch.log_softmax(scores / temperature, dim=0)).sum()


def pinball_loss(pred: torch.Tensor, targets: torch.Tensor, quantiles: Sequence[float]
                 ) -> torch.Tensor:
    """Mean quantile (pinball) loss; pred [B, Q], one column per quantile level."""
    q = torch.tensor(list(quantiles), dtype=pred.dtype)
    err = targets.unsqueeze(1) - pred
    return torch.maximum(q * err, (q - 1.0) * err).mean(0).sum()


def length_loss(outputs: torch.Tensor, log_targets: torch.Tensor, rank_weight: float,
                rank_loss: str = "pairwise", quantiles: Sequence[float] = (),
                quantile_weight: float = 1.0, temperature: float = 1.0) -> torch.Tensor:
    """outputs [B, 1 + Q]: column 0 the point estimate (L1), the rest the quantiles."""
    scores = outputs[:, 0]
    loss = F.l1_loss(scores, log_targets)
    if rank_weight > 0:
        rank = (listnet_loss(scores, log_targets, temperature) if rank_loss == "listnet"
                else pairwise_rank_loss(scores, log_targets))
        loss = loss + rank_weight * rank
    if quantiles:
        loss = loss + quantile_weight * pinball_loss(outputs[:, 1:], log_targets, quantiles)
    return loss


@dataclass(slots=True)
class TrainConfig:
    epochs: int = 3  # dev error rises after ~3 epochs: the bag table overfits
    batch_size: int = 256
    lr: float = 2e-3
    weight_decay: float = 1e-4
    rank_weight: float = 0.0
    rank_loss: str = "pairwise"  # "pairwise" (RankNet) or "listnet"
    rank_temperature: float = 1.0  # listnet: softmax temperature on log lengths
    quantile_weight: float = 1.0  # pinball loss weight (when the net has quantile outputs)
    seed: int = 0


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    torch.use_deterministic_algorithms(True)


def fit(cfg: NetConfig, rows: FeatureRows, log_targets: np.ndarray, tc: TrainConfig,
        desc: str = "train") -> LengthNet:
    """AdamW with cosine decay; the net predicts log1p(tokens)."""
    seed_everything(tc.seed)
    net = LengthNet(cfg)
    net.num_mean.copy_(torch.from_numpy(rows.numeric.mean(0)))
    net.num_std.copy_(torch.from_numpy(rows.numeric.std(0) + 1e-3))
    net.target_bias.fill_(float(np.median(log_targets)))
    opt = torch.optim.AdamW(net.parameters(), lr=tc.lr, weight_decay=tc.weight_decay)
    steps_per_epoch = math.ceil(len(rows) / tc.batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=tc.lr, pct_start=0.1,
                                                total_steps=steps_per_epoch * tc.epochs)
    rng = np.random.default_rng(tc.seed)
    targets = torch.from_numpy(log_targets.astype(np.float32))
    net.train()
    with tqdm(total=steps_per_epoch * tc.epochs, desc=desc, unit="step", mininterval=2) as bar:
        for epoch in range(tc.epochs):
            order = rng.permutation(len(rows))
            for start in range(0, len(order), tc.batch_size):
                idx = order[start:start + tc.batch_size]
                loss = length_loss(net.forward_all(rows.batch(idx)), targets[idx],
                                   tc.rank_weight, tc.rank_loss, cfg.quantiles,
                                   tc.quantile_weight, tc.rank_temperature)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                bar.update(1)
            bar.set_postfix(epoch=epoch + 1, loss=f"{loss.item():.3f}")
    return net.eval()


def all_outputs(net: Net, rows: FeatureRows, batch_size: int = 1024) -> np.ndarray:
    """[N, 1 + Q]: point log-score, then the quantiles sorted ascending (no crossing)."""
    out = []
    with torch.inference_mode():
        for start in range(0, len(rows), batch_size):
            out.append(net.forward_all(rows.batch(range(start, min(len(rows),
                                                                    start + batch_size)))).numpy())
    if not out:
        return np.zeros((0, 1 + len(net.cfg.quantiles)), np.float32)
    return sort_quantiles(np.concatenate(out))


def sort_quantiles(outputs: np.ndarray) -> np.ndarray:
    outputs = outputs.copy()
    outputs[:, 1:] = np.sort(outputs[:, 1:], axis=1)
    return outputs


def fit_members(cfg: NetConfig, rows: FeatureRows, log_targets: np.ndarray, tc: TrainConfig,
                desc: str = "train") -> Net:
    """One net, or cfg.members nets seeded tc.seed, tc.seed + 1, ... averaged."""
    if cfg.members == 1:
        return fit(cfg, rows, log_targets, tc, desc)
    return LengthEnsemble(cfg, [fit(cfg, rows, log_targets, replace(tc, seed=tc.seed + i),
                                    f"{desc} {i + 1}/{cfg.members}")
                                for i in range(cfg.members)]).eval()


def scores(net: Net, rows: FeatureRows, batch_size: int = 1024) -> np.ndarray:
    return all_outputs(net, rows, batch_size)[:, 0]


def calibration(log_scores: np.ndarray, lengths: np.ndarray) -> float:
    """Scale c minimising sum (c*expm1(s) - y)^2: turns a log-median into a mean estimate."""
    p = np.expm1(log_scores.astype(np.float64))
    return float((p * lengths).sum() / max((p * p).sum(), 1e-9))
