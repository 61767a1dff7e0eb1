"""The eval report: quality on a data file, baselines, and latency."""

from __future__ import annotations

from typing import Any

import numpy as np
from tqdm import tqdm

from predictor.api import PredictInput, Predictor
from predictor.latency import batch_ms, percentiles, single_request_ms
from predictor.manifest import Manifest
from predictor.metrics import quality
from predictor.records import Record
from predictor.text import render

LONG_PROMPT_CHARS = 3000  # comfortably over 512 encoder tokens (~4-5 chars per word piece)


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
    first = np.asarray([sum(m.role == "user" for m in r.messages) == 1 for r in records])
    result["by_round"] = {name: quality(pred[mask], true[mask], manifest.quintiles)
                          for name, mask in (("first", first), ("later", ~first)) if mask.any()}
    result.update(latency(predictor, inputs))
    result["baselines"] = baselines(manifest, records, true)
    extra = getattr(predictor, "eval_extra", None)
    if extra is not None:
        result.update(extra(records))
    return result
