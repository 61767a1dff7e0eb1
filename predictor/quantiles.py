"""Quantiles of the output length from a net's quantile outputs (log1p tokens)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MIN_CONFORMAL_ROWS = 200  # fewer dev rows than this: no shift (too noisy to fit)


def conformal_offsets(outputs: np.ndarray, levels: Sequence[float], true: np.ndarray
                      ) -> list[float]:
    """Split-conformal shifts (log space), one per level: the level-quantile of
    log1p(true) - predicted quantile, so that after the shift the share of these lengths at
    or under each quantile is its level. The net's own quantiles come out too narrow off
    its training set (the bag table memorises), which this corrects."""
    if not levels or len(true) < MIN_CONFORMAL_ROWS:
        return []
    resid = np.log1p(np.asarray(true, np.float64))[:, None] - outputs[:, 1:].astype(np.float64)
    return [float(np.quantile(resid[:, j], q, method="higher")) for j, q in enumerate(levels)]


def shifted(outputs: np.ndarray, offsets: Sequence[float]) -> np.ndarray:
    """Outputs with the conformal shifts added to the quantile columns (re-sorted)."""
    if not offsets:
        return outputs
    out = outputs.astype(np.float64).copy()
    out[:, 1:] = np.sort(out[:, 1:] + np.asarray(offsets, np.float64), axis=1)
    return out


def quantile_tokens(outputs: np.ndarray, levels: Sequence[float], qs: Sequence[float]
                    ) -> np.ndarray:
    """[N, len(qs)] tokens (>= 1). outputs [N, 1 + L]: point, then the L trained quantiles of
    log1p(tokens), sorted. A requested level between trained ones is interpolated linearly in
    log space; one outside the trained range is refused (extrapolating a tail is a guess)."""
    if not levels:
        raise NotImplementedError("this model was trained without quantile outputs "
                                  "(retrain with --quantiles)")
    lv = np.asarray(levels, np.float64)
    bad = [q for q in qs if not lv[0] - 1e-9 <= q <= lv[-1] + 1e-9]
    if bad:
        raise ValueError(f"quantile levels {bad} outside the trained range "
                         f"[{lv[0]}, {lv[-1]}]")
    logq = outputs[:, 1:].astype(np.float64)
    cols = [np.asarray([np.interp(q, lv, row) for row in logq]) for q in qs]
    out = np.stack(cols, axis=1) if cols else np.zeros((len(outputs), 0))
    return np.maximum(np.expm1(out), 1.0)
