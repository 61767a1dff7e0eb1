"""Per-window quality of remaining-length re-prediction (ELIS windows).

Window j = the first j*K answer tokens are known (cut with the serving tokenizer); the
target is the true remaining tokens. The iterative model is compared with the baseline a
daemon without one uses: the first prediction minus the tokens generated so far.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from predictor.api import PredictInput, Predictor
from predictor.evaluate import batch_ms, percentiles, quality, single_request_ms
from predictor.records import Record, is_first_turn
from predictor.windows import WindowExamples, window_examples

_CHUNK = 256  # rows per model call: bounded memory, same results as one call


def log_ratio(pred: np.ndarray, true: np.ndarray) -> dict[str, float]:
    """log(predicted / true remaining): its spread is the re-prediction noise to simulate."""
    r = np.log(np.maximum(pred, 1.0) / np.maximum(true, 1.0))
    return {"log_ratio_mean": float(r.mean()), "log_ratio_std": float(r.std())}


def iterative_remaining(model: Predictor, inputs: list[PredictInput],
                        ex: WindowExamples) -> np.ndarray:
    pairs = [(inputs[r], p) for r, p in zip(ex.record, ex.partial, strict=True)]
    chunks = [np.asarray(model.predict_remaining(pairs[s:s + _CHUNK]), np.float64)
              for s in range(0, len(pairs), _CHUNK)]
    return np.concatenate(chunks or [np.zeros(0)])


def baseline_remaining(first: Predictor, inputs: list[PredictInput], ex: WindowExamples,
                       window: int) -> np.ndarray:
    chunks = [np.asarray(first.predict(inputs[s:s + _CHUNK]), np.float64)
              for s in range(0, len(inputs), _CHUNK)]
    totals = np.concatenate(chunks or [np.zeros(0)])
    generated = np.asarray(ex.window, np.float64) * window
    return np.maximum(totals[ex.record] - generated, 1.0)


def window_report(model: Predictor, first: Predictor | None, records: list[Record],
                  tokenizer: str, max_windows: int = 10, window: int = 50,
                  bounds: list[float] | None = None) -> dict[str, Any]:
    """{"all"|"first": {j: {"n", "iterative": metrics, "baseline": metrics}}}."""
    ex = window_examples(records, window, max_windows, tokenizer)
    inputs = [PredictInput.from_record(r) for r in records]
    preds = {"iterative": iterative_remaining(model, inputs, ex)}
    if first is not None:
        preds["baseline"] = baseline_remaining(first, inputs, ex, window)
    win = np.asarray(ex.window)
    first_turn = np.asarray([is_first_turn(r) for r in records])[ex.record]
    report: dict[str, Any] = {"window_tokens": window, "records": len(records)}
    for scope, mask in (("all", np.ones(len(win), bool)), ("first", first_turn)):
        rows: dict[str, Any] = {}
        for j in range(max_windows + 1):
            sel = mask & (win == j)
            if sel.sum() < 2:
                continue
            true = ex.remaining[sel]
            rows[str(j)] = {"n": int(sel.sum())} | {
                name: quality(p[sel], true, bounds or []) | log_ratio(p[sel], true)
                for name, p in preds.items()}
        report[scope] = rows
    report["latency"] = latency(model, inputs, ex, min(5, max_windows))
    return report


def latency(model: Predictor, inputs: list[PredictInput], ex: WindowExamples,
            j: int) -> dict[str, float]:
    """predict_remaining on window-j inputs (j*K tokens of answer), one thread."""
    pairs = [(inputs[r], p) for r, p, w in zip(ex.record, ex.partial, ex.window, strict=True)
             if w == j]
    if not pairs:
        return {}
    return {"window": j} | percentiles(single_request_ms(model.predict_remaining, pairs)) | {
        "batch32_ms": batch_ms(model.predict_remaining, pairs)}


def markdown(report: dict[str, Any], scope: str) -> str:
    """One table: a row per window, MAE / tau / R^2 / log-ratio std per predictor."""
    names = [n for n in ("iterative", "baseline") if n in next(iter(report[scope].values()))]
    head = "| j | n | " + " | ".join(f"{n} MAE | {n} τ | {n} R² | {n} σ(log)" for n in names)
    lines = [head + " |", "|" + "---|" * (2 + 4 * len(names))]
    for j, row in report[scope].items():
        cells = [j, f"{row['n']:,}"]
        for n in names:
            m = row[n]
            cells += [f"{m['mae']:.1f}", f"{m['kendall_tau']:.3f}", f"{m['r2']:.3f}",
                      f"{m['log_ratio_std']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
