"""The eval report: quality on a data file, baselines, and latency."""

from __future__ import annotations

from typing import Any

import numpy as np
from tqdm import tqdm

from predictor.api import PredictInput, Predictor
from predictor.latency import batch_ms, percentiles, single_request_ms
from predictor.manifest import Manifest
from predictor.metrics import quality
from predictor.quantiles import coverage
from predictor.records import Record, is_first_turn, render

LONG_PROMPT_CHARS = 3000  # comfortably over 512 encoder tokens (~4-5 chars per word piece)
CONTEXT_TOKENS = 2048  # the serving model's context: longer answers cannot occur in serving


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
