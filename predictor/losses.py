"""Training losses: L1 (SSJF) on log length, plus an optional pairwise ranking term."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def pairwise_rank_loss(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """RankNet logistic loss over all ordered pairs in the batch: SJF needs order, not values."""
    diff_t = targets.unsqueeze(1) - targets.unsqueeze(0)
    diff_s = scores.unsqueeze(1) - scores.unsqueeze(0)
    mask = diff_t > 0.05  # ignore near-ties (in log space: under ~5 %)
    if not bool(mask.any()):
        return scores.sum() * 0.0
    return F.softplus(-diff_s[mask]).mean()


def length_loss(scores: torch.Tensor, log_targets: torch.Tensor, rank_weight: float) -> torch.Tensor:
    loss = F.l1_loss(scores, log_targets)
    if rank_weight > 0:
        loss = loss + rank_weight * pairwise_rank_loss(scores, log_targets)
    return loss
