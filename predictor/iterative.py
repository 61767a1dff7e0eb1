"""Iterative predictor (ELIS): remaining tokens from prompt + partial answer, re-asked every
window (K = 50 tokens) while a job runs. Its examples (one per K-token window of an answer,
cut with the serving tokenizer), its training, its serving, and the per-window report that
compares it with what a daemon without one uses: the first prediction minus the tokens
generated so far."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch

from predictor.api import PredictInput, Predictor
from predictor.dataset import TokenCounter, TrainData, chars_per_token
from predictor.evaluate import batch_ms, percentiles, quality, single_request_ms
from predictor.features import (
    NUM_PARTIAL,
    NUMERIC_NAMES,
    BagTokenizer,
    FeatureRows,
    add_partials,
    featurize,
)
from predictor.manifest import Manifest, NetConfig, write_manifest
from predictor.net import Net, load_net, save_net
from predictor.proxy import ProxyOptions, base_manifest
from predictor.records import Record, is_first_turn
from predictor.trainer import TrainConfig, calibration, fit, scores

_CHUNK = 256  # rows per model call in the report: bounded memory, same results as one call


@dataclass(slots=True)
class WindowExamples:
    record: list[int]  # index of the source record
    window: list[int]  # j: the partial answer holds the first j*K tokens
    partial: list[str]
    remaining: np.ndarray  # true remaining tokens (>= 1)


def window_examples(records: list[Record], window: int, max_windows: int,
                    tokenizer_dir: str) -> WindowExamples:
    """j = 0 (prompt only) up to the last window that still leaves >= 1 token to generate."""
    counter = TokenCounter(tokenizer_dir)
    out = WindowExamples(record=[], window=[], partial=[], remaining=np.zeros(0))
    remaining: list[int] = []
    for i, r in enumerate(records):
        prefixes = [""] + counter.prefixes(r.response, window, max_windows)
        for j, partial in enumerate(prefixes):
            if r.output_tokens - j * window < 1:
                break
            out.record.append(i)
            out.window.append(j)
            out.partial.append(partial)
            remaining.append(r.output_tokens - j * window)
    out.remaining = np.asarray(remaining, dtype=np.float64)
    return out


def window_rows(bagger: BagTokenizer, records: list[Record], ex: WindowExamples,
                cpt: float) -> FeatureRows:
    """Per-record features are computed once and shared (by reference) by its windows."""
    base = featurize(bagger, [r.messages for r in records])
    expanded = FeatureRows(prompt_bags=[base.prompt_bags[i] for i in ex.record],
                           hist_bags=[base.hist_bags[i] for i in ex.record],
                           numeric=base.numeric[ex.record])
    generated = [round(len(p) / cpt) for p in ex.partial]  # as at serving time
    return add_partials(bagger, expanded, ex.partial, generated)


def train_iterative(data: TrainData, opts: ProxyOptions, tc: TrainConfig, out: Path,
                    window: int, max_windows: int, tokenizer: str) -> Manifest:
    t0 = time.perf_counter()
    bagger = BagTokenizer(opts.encoder)
    cpt = chars_per_token(data.train)
    train_ex = window_examples(data.train, window, max_windows, tokenizer)
    dev_ex = window_examples(data.dev, window, max_windows, tokenizer)
    print(f"{len(train_ex.window)} training windows, {len(dev_ex.window)} dev windows")
    train_rows = window_rows(bagger, data.train, train_ex, cpt)
    dev_rows = window_rows(bagger, data.dev, dev_ex, cpt) if len(dev_ex.window) else None
    cfg = NetConfig(table_size=bagger.table_size, num_numeric=len(NUMERIC_NAMES) + NUM_PARTIAL,
                    bag_dim=opts.bag_dim, hidden=opts.hidden, partial=True)
    net = fit(cfg, train_rows, np.log1p(train_ex.remaining), tc, desc="train iterative")
    manifest = base_manifest("iterative", data, opts, cfg, tc.seed)
    cal = calibration(scores(net, train_rows), train_ex.remaining)
    dev: dict[str, float] = {}
    if dev_rows is not None:
        pred = np.maximum(cal * np.expm1(scores(net, dev_rows).astype(np.float64)), 1.0)
        dev = quality(pred, dev_ex.remaining, manifest.quintiles)
        first = np.asarray(dev_ex.window) == 0
        dev |= {f"window0_{k}": v for k, v in
                quality(pred[first], dev_ex.remaining[first], manifest.quintiles).items()}
    out.mkdir(parents=True, exist_ok=True)
    save_net(net, out)
    manifest = msgspec.structs.replace(manifest, calibration=cal, dev_metrics=dev, window=window,
                                       tokenizer=tokenizer,  # as given: a path on the training host
                                       train_seconds=time.perf_counter() - t0)
    write_manifest(out, manifest)
    return manifest


class IterativePredictor(Predictor):
    kind = "iterative"

    def __init__(self, path: Path, manifest: Manifest, net: Net) -> None:
        self.path, self.manifest, self.net = path, manifest, net
        self.bagger = BagTokenizer(manifest.encoder)
        self.chars_per_token = manifest.chars_per_token
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: Path, manifest: Manifest) -> IterativePredictor:
        assert manifest.net is not None and manifest.net.partial
        return cls(path, manifest, load_net(manifest.net, path))

    def rows(self, batch: list[tuple[PredictInput, str]]) -> FeatureRows:
        base = featurize(self.bagger, [inp.messages for inp, _ in batch])
        partials = [partial for _, partial in batch]
        # Token count estimated from characters, exactly as in training (consistent inputs).
        return add_partials(self.bagger, base, partials, [round(self.tokens_in(p)) for p in partials])

    def predict_remaining(self, batch: list[tuple[PredictInput, str]]) -> list[float]:
        if not batch:
            return []
        with self._lock, torch.inference_mode():
            s = self.net(self.rows(batch).batch(range(len(batch)))).numpy().astype(np.float64)
        return [max(1.0, float(v)) for v in self.manifest.calibration * np.expm1(s)]

    def predict(self, batch: list[PredictInput]) -> list[float]:
        """Before the first token: remaining == total."""
        return self.predict_remaining([(inp, "") for inp in batch])

    def eval_extra(self, records: list[Record]) -> dict[str, object]:
        """The same metrics per window index j (partial answer = first j*K tokens)."""
        if not self.manifest.tokenizer:
            return {}
        report = window_report(self, None, records, self.manifest.tokenizer, 8,
                               self.manifest.window, self.manifest.quintiles)
        return {"per_window": {j: row["iterative"] for j, row in report["all"].items()}}


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
    report["latency"] = window_latency(model, inputs, ex, min(5, max_windows))
    return report


def window_latency(model: Predictor, inputs: list[PredictInput], ex: WindowExamples,
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
