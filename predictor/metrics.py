"""Prediction-quality metrics: regression errors, SSJF's 5-class accuracy, Kendall's tau."""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import kendalltau


def quintiles(train_lengths: np.ndarray) -> list[float]:
    """Class boundaries for acc5: the 20/40/60/80 % points of the *training* lengths."""
    return [float(q) for q in np.percentile(train_lengths, [20, 40, 60, 80])]


def quality(pred: np.ndarray, true: np.ndarray, bounds: list[float]) -> dict[str, float]:
    pred = np.asarray(pred, dtype=np.float64)
    true = np.asarray(true, dtype=np.float64)
    err = pred - true
    var = float(np.var(true))
    tau = kendalltau(pred, true).statistic if len(true) > 1 else float("nan")
    return {
        "n": len(true),
        "mae": float(np.mean(np.abs(err))),
        "rmse": float(np.sqrt(np.mean(err**2))),
        "r2": float(1.0 - np.mean(err**2) / var) if var > 0 else float("nan"),
        "acc5": float(np.mean(np.digitize(pred, bounds) == np.digitize(true, bounds))),
        "kendall_tau": 0.0 if math.isnan(tau) else float(tau),  # constant predictions: nan
    }


def linear_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares y = a*x + b (the prompt-length baseline)."""
    a, b = np.polyfit(np.asarray(x, np.float64), np.asarray(y, np.float64), 1)
    return float(a), float(b)
