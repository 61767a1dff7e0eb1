"""Training losses on log length: L1 (SSJF), pinball for the quantile outputs, and an
optional ranking term, pairwise (RankNet) or listwise (ListNet over the batch)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

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
