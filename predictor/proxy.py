"""Proxy predictor (SSJF): features (+ optional frozen encoder) -> MLP -> output tokens."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from predictor.api import PredictInput, Predictor
from predictor.features import BagTokenizer, FeatureRows, TextEncoder, featurize
from predictor.manifest import Manifest
from predictor.net import Net, load_net
from predictor.quantiles import quantile_tokens, shifted
from predictor.records import render
from predictor.trainer import sort_quantiles


class ProxyPredictor(Predictor):
    kind = "proxy"

    def __init__(self, path: Path, manifest: Manifest, net: Net,
                 encoder: TextEncoder | None) -> None:
        self.path, self.manifest, self.net, self.encoder = path, manifest, net, encoder
        self.bagger = BagTokenizer(manifest.encoder)
        self.chars_per_token = manifest.chars_per_token
        self._lock = threading.Lock()  # torch modules are not re-entrant across threads

    @classmethod
    def load(cls, path: Path, manifest: Manifest) -> ProxyPredictor:
        assert manifest.net is not None
        encoder = (TextEncoder(manifest.encoder, manifest.encoder_max_tokens)
                   if manifest.net.emb_dim else None)
        return cls(path, manifest, load_net(manifest.net, path), encoder)

    def rows(self, batch: list[PredictInput]) -> FeatureRows:
        rows = featurize(self.bagger, [inp.messages for inp in batch])
        if self.encoder is not None:
            rows.emb = self.encoder.embed([render(inp.messages) for inp in batch])
        return rows

    def tokens_from_scores(self, s: np.ndarray) -> list[float]:
        return [max(1.0, float(v)) for v in self.manifest.calibration * np.expm1(s)]

    def outputs(self, batch: list[PredictInput]) -> np.ndarray:
        """[B, 1 + Q]: point log-score, then the sorted quantiles of log1p(tokens)."""
        with self._lock, torch.inference_mode():
            out = self.net.forward_all(self.rows(batch).batch(range(len(batch))))
        return sort_quantiles(out.numpy().astype(np.float64))

    def predict(self, batch: list[PredictInput]) -> list[float]:
        if not batch:
            return []
        return self.tokens_from_scores(self.outputs(batch)[:, 0])

    def predict_quantiles(self, batch: list[PredictInput],
                          qs: Sequence[float] = (0.5, 0.9)) -> list[tuple[float, ...]]:
        levels = self.manifest.net.quantiles if self.manifest.net else ()
        if not batch:
            quantile_tokens(np.zeros((0, 1 + len(levels))), levels, qs)  # same errors
            return []
        out = shifted(self.outputs(batch), self.manifest.quantile_offsets)
        return [tuple(float(v) for v in row) for row in quantile_tokens(out, levels, qs)]
