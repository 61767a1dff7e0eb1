"""Least-squares fit of SimExecutor's step-cost model to profile points (see bench/profile.py)."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np
from scipy.optimize import nnls

from bench.costfile import FitReport, Point
from daemon.executors.settings import SimConfig


def _nnls_relative(features: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Non-negative coefficients minimising sum((pred - y) / y)^2: relative error, so the
    many fast points count as much as the few slow ones."""
    weights = 1.0 / seconds
    coef, _ = nnls(features * weights[:, None], seconds * weights)
    return np.asarray(coef)


def decode_features(points: Sequence[Point]) -> np.ndarray:
    return np.array([[1.0, p.batch, p.context_tokens] for p in points])


def fit_points(points: Sequence[Point]) -> tuple[SimConfig, FitReport, list[Point]]:
    """Coefficients, fit errors, and the points with the fitted values filled in."""
    decode = [p for p in points if p.kind == "decode"]
    prefill = [p for p in points if p.kind == "prefill"]
    if len(decode) < 3 or len(prefill) < 2:
        raise ValueError("need >= 3 decode and >= 2 prefill points to fit")
    d_base, d_seq, d_ctx = _nnls_relative(decode_features(decode),
                                          np.array([p.seconds for p in decode]))
    # A prefill step also pays the decode part for its one sequence (SimExecutor adds both).
    decode_part = np.array([d_base + d_seq + d_ctx * p.context_tokens for p in prefill])
    ttft = np.array([p.seconds for p in prefill])
    residual = np.maximum(ttft - decode_part, 1e-6)
    p_base, p_tok = _nnls_relative(np.array([[1.0, p.input_tokens] for p in prefill]), residual)
    sim = SimConfig(prefill_base_s=float(p_base), prefill_per_token_s=float(p_tok),
                    decode_base_s=float(d_base), decode_per_seq_s=float(d_seq),
                    decode_per_context_token_s=float(d_ctx))
    fitted = [msgspec.structs.replace(p, predicted=predict(sim, p)) for p in points]
    return sim, report(fitted), fitted


def predict(sim: SimConfig, p: Point) -> float:
    decode = (sim.decode_base_s + sim.decode_per_seq_s * p.batch
              + sim.decode_per_context_token_s * p.context_tokens)
    if p.kind == "decode":
        return decode
    return sim.prefill_base_s + sim.prefill_per_token_s * p.input_tokens + decode


def report(points: Sequence[Point]) -> FitReport:
    def errors(kind: str) -> np.ndarray:
        return np.array([abs(p.predicted - p.seconds) / p.seconds
                         for p in points if p.kind == kind] or [0.0])

    pre, dec = errors("prefill"), errors("decode")
    return FitReport(prefill_mape=float(pre.mean()), decode_mape=float(dec.mean()),
                     prefill_max_error=float(pre.max()), decode_max_error=float(dec.max()))
