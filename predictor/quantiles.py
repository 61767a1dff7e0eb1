"""Quantiles of the output length from a net's quantile outputs (log1p tokens)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


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


def coverage(upper: np.ndarray, true: np.ndarray) -> float:
    """Share of true lengths at or under the predicted quantile (0.9 for a calibrated p90)."""
    return float(np.mean(np.asarray(true, np.float64) <= np.asarray(upper, np.float64)))
