"""Iterative predictor (ELIS): remaining tokens from prompt + partial answer, re-asked every
window (K = 50 tokens) while a job runs."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import torch

from predictor.api import PredictInput, Predictor
from predictor.features import BagTokenizer, FeatureRows, add_partials, featurize
from predictor.manifest import Manifest
from predictor.net import Net, load_net


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

    def eval_extra(self, records) -> dict[str, object]:
        """The same metrics per window index j (partial answer = first j*K tokens)."""
        from predictor.window_eval import window_report

        if not self.manifest.tokenizer:
            return {}
        report = window_report(self, None, records, self.manifest.tokenizer, 8,
                               self.manifest.window, self.manifest.quintiles)
        return {"per_window": {j: row["iterative"] for j, row in report["all"].items()}}
