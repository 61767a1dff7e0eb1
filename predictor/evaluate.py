"""Prediction quality and the eval report: regression errors, SSJF's 5-class accuracy,
Kendall's tau and quantile coverage on a data file, the baselines, and predict latency
(single request, batch of 32, long prompts)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
from tqdm import tqdm

from predictor.api import PredictInput, Predictor
from predictor.manifest import Manifest
from predictor.records import Record, is_first_turn, render

T = TypeVar("T")
LONG_PROMPT_CHARS = 3000  # comfortably over 512 encoder tokens (~4-5 chars per word piece)
CONTEXT_TOKENS = 2048  # the serving model's context: longer answers cannot occur in serving


def quintiles(train_lengths: np.ndarray) -> list[float]:
    """Class boundaries for acc5: the 20/40/60/80 % points of the *training* lengths."""
    return [float(q) for q in np.percentile(train_lengths, [20, 40, 60, 80])]


def quality(pred: np.ndarray, true: np.ndarray, bounds: list[float]) -> dict[str, float]:
    # Imported here: the predictors import this module when serving, and scipy costs there.
    from scipy.stats import kendalltau

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


def coverage(upper: np.ndarray, true: np.ndarray) -> float:
    """Share of true lengths at or under the predicted quantile (0.9 for a calibrated p90)."""
    return float(np.mean(np.asarray(true, np.float64) <= np.asarray(upper, np.float64)))


def timed_ms(fn: Callable[[], object], repeats: int) -> np.ndarray:
    fn()  # warm-up: first calls pay for lazy allocations
    out: list[float] = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000.0)
    return np.asarray(out)


def single_request_ms(predict: Callable[[list[T]], object], inputs: Sequence[T],
                      repeats: int = 50) -> np.ndarray:
    picks = [inputs[i % len(inputs)] for i in range(repeats)]
    it = iter(picks * 2)
    return timed_ms(lambda: predict([next(it)]), repeats)


def batch_ms(predict: Callable[[list[T]], object], inputs: Sequence[T], size: int = 32,
             repeats: int = 5) -> float:
    batch = [inputs[i % len(inputs)] for i in range(size)]
    return float(np.median(timed_ms(lambda: predict(batch), repeats)))


def percentiles(ms: np.ndarray) -> dict[str, float]:
    if len(ms) == 0:
        return {"p50_ms": float("nan"), "p99_ms": float("nan")}
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99))}


def predict_all(predictor: Predictor, inputs: list[PredictInput], true: np.ndarray,
                online: bool, batch: int = 64) -> np.ndarray:
    """online: after each batch, feed its true lengths back (as the daemon does on completion)."""
    out: list[float] = []
    for start in tqdm(range(0, len(inputs), batch), desc="predict", unit="batch", mininterval=5):
        part = inputs[start:start + batch]
        out.extend(predictor.predict(part))
        if online:
            for inp, tokens in zip(part, true[start:start + batch]):
                predictor.observe(inp, int(tokens))
    return np.asarray(out, dtype=np.float64)


def quantiles_or_none(predictor: Predictor, inputs: list[PredictInput], batch: int = 64
                      ) -> np.ndarray | None:
    """[N, 2] predicted p50 and p90, or None for a model without quantile outputs."""
    try:
        rows = [q for s in range(0, len(inputs), batch)
                for q in predictor.predict_quantiles(inputs[s:s + batch], (0.5, 0.9))]
    except (NotImplementedError, ValueError):
        return None
    return np.asarray(rows, np.float64).reshape(len(inputs), 2)


def coverages(quant: np.ndarray, true: np.ndarray) -> dict[str, float]:
    return {"coverage_p50": coverage(quant[:, 0], true), "coverage_p90": coverage(quant[:, 1], true)}


def baselines(manifest: Manifest, records: list[Record], true: np.ndarray) -> dict[str, Any]:
    a, b = manifest.baseline_linear
    chars = np.asarray([len(render(r.messages)) for r in records], np.float64)
    mean_pred = np.full(len(records), manifest.train_mean)
    return {"train_mean": quality(mean_pred, true, manifest.quintiles),
            "linear_prompt_length": quality(np.maximum(a * chars + b, 1.0), true,
                                            manifest.quintiles)}


def latency(predictor: Predictor, inputs: list[PredictInput]) -> dict[str, float]:
    report = percentiles(single_request_ms(predictor.predict, inputs))
    report["batch32_ms"] = batch_ms(predictor.predict, inputs)
    long_inputs = [i for i in inputs if len(render(i.messages)) >= LONG_PROMPT_CHARS]
    if long_inputs:
        report["p50_ms_512tok"] = percentiles(single_request_ms(predictor.predict, long_inputs,
                                                                30))["p50_ms"]
    return report


def report(predictor: Predictor, manifest: Manifest, records: list[Record],
           online: bool = False) -> dict[str, Any]:
    inputs = [PredictInput.from_record(r) for r in records]
    true = np.asarray([r.output_tokens for r in records], np.float64)
    result: dict[str, Any] = {"kind": predictor.kind, "online": online}
    pred = predict_all(predictor, inputs, true, online)
    result.update(quality(pred, true, manifest.quintiles))
    quant = quantiles_or_none(predictor, inputs)
    if quant is not None:
        result.update(coverages(quant, true))
    first = np.asarray([is_first_turn(r) for r in records])
    result["by_round"] = {}
    for name, mask in (("first", first), ("later", ~first)):
        if mask.any():
            result["by_round"][name] = quality(pred[mask], true[mask], manifest.quintiles)
            if quant is not None:
                result["by_round"][name].update(coverages(quant[mask], true[mask]))
    fits = true <= CONTEXT_TOKENS
    result[f"within_{CONTEXT_TOKENS}"] = quality(pred[fits], true[fits], manifest.quintiles) | {
        "dropped": int((~fits).sum())}
    result.update(latency(predictor, inputs))
    result["baselines"] = baselines(manifest, records, true)
    extra = getattr(predictor, "eval_extra", None)
    if extra is not None:
        result.update(extra(records))
    return result
