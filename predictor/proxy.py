"""Proxy predictor (SSJF): bag + numeric features (+ an optional frozen encoder) -> LengthNet
-> output tokens, with a quantile head: the net's quantiles of log1p(tokens), shifted by
split-conformal offsets fitted on dev. Its training (featurise, fit, calibrate, measure on
dev, save) and its serving."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
import torch
from tqdm import tqdm

from predictor.api import PredictInput, Predictor
from predictor.dataset import TrainData, chars_per_token, lengths
from predictor.evaluate import coverage, linear_fit, quality, quintiles
from predictor.features import (
    NUMERIC_NAMES,
    BagTokenizer,
    FeatureRows,
    TextEncoder,
    attach_embeddings,
    featurize,
)
from predictor.manifest import Manifest, NetConfig, write_manifest
from predictor.net import Net, load_net, save_net
from predictor.records import Record, is_first_turn, render
from predictor.trainer import (
    TrainConfig,
    all_outputs,
    calibration,
    fit_members,
    scores,
    sort_quantiles,
)

MIN_CONFORMAL_ROWS = 200  # fewer dev rows than this: no shift (too noisy to fit)


def conformal_offsets(outputs: np.ndarray, levels: Sequence[float], true: np.ndarray
                      ) -> list[float]:
    """Split-conformal shifts (log space), one per level: the level-quantile of
    log1p(true) - predicted quantile, so that after the shift the share of these lengths at
    or under each quantile is its level. The net's own quantiles come out too narrow off
    its training set (the bag table memorises), which this corrects."""
    if not levels or len(true) < MIN_CONFORMAL_ROWS:
        return []
    resid = np.log1p(np.asarray(true, np.float64))[:, None] - outputs[:, 1:].astype(np.float64)
    return [float(np.quantile(resid[:, j], q, method="higher")) for j, q in enumerate(levels)]


def shifted(outputs: np.ndarray, offsets: Sequence[float]) -> np.ndarray:
    """Outputs with the conformal shifts added to the quantile columns (re-sorted)."""
    if not offsets:
        return outputs
    out = outputs.astype(np.float64).copy()
    out[:, 1:] = np.sort(out[:, 1:] + np.asarray(offsets, np.float64), axis=1)
    return out


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


def quantile_metrics(outputs: np.ndarray, levels: tuple[float, ...], true: np.ndarray
                     ) -> dict[str, float]:
    """Coverage of the predicted p50 and p90 (share of true lengths at or under them)."""
    if not levels or not (min(levels) <= 0.5 and max(levels) >= 0.9):
        return {}
    q = quantile_tokens(outputs, levels, (0.5, 0.9))
    return {"coverage_p50": coverage(q[:, 0], true), "coverage_p90": coverage(q[:, 1], true)}


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

    def predict_with_upper(self, batch: list[PredictInput], q: float
                           ) -> tuple[list[float], list[float] | None]:
        """Both from one forward pass (the daemon asks for them together)."""
        levels = self.manifest.net.quantiles if self.manifest.net else ()
        if not batch:
            return [], []
        out = self.outputs(batch)
        points = self.tokens_from_scores(out[:, 0])
        try:
            upper = quantile_tokens(shifted(out, self.manifest.quantile_offsets), levels, (q,))
        except (NotImplementedError, ValueError):
            return points, None
        return points, [float(v) for v in upper[:, 0]]

    def predict_quantiles(self, batch: list[PredictInput],
                          qs: Sequence[float] = (0.5, 0.9)) -> list[tuple[float, ...]]:
        levels = self.manifest.net.quantiles if self.manifest.net else ()
        if not batch:
            quantile_tokens(np.zeros((0, 1 + len(levels))), levels, qs)  # same errors
            return []
        out = shifted(self.outputs(batch), self.manifest.quantile_offsets)
        return [tuple(float(v) for v in row) for row in quantile_tokens(out, levels, qs)]


@dataclass(slots=True)
class ProxyOptions:
    encoder: str = "minilm"
    use_encoder: bool = False  # frozen transformer embedding as an extra input (slow on CPU)
    encoder_max_tokens: int = 512
    cache_dir: Path | None = None
    bag_dim: int = 16  # 16 matched 32 on dev and halves the shipped file
    hidden: int = 256
    quantiles: tuple[float, ...] = (0.1, 0.5, 0.9)  # levels of the quantile head; () = none
    members: int = 1  # nets averaged (seeds seed, seed + 1, ...)


def rendered(records: list[Record]) -> list[str]:
    return [render(r.messages) for r in records]


def build_rows(records: list[Record], bagger: BagTokenizer, opts: ProxyOptions,
               encoder: TextEncoder | None, desc: str) -> FeatureRows:
    rows = featurize(bagger, [r.messages for r in records])
    if encoder is not None:
        with tqdm(total=len(records), desc=f"embed {desc}", unit="rec", mininterval=5) as bar:
            cache = opts.cache_dir / f"{Path(opts.encoder).name}-{opts.encoder_max_tokens}" \
                if opts.cache_dir else None
            attach_embeddings(rows, rendered(records), encoder, cache, progress=bar)
    return rows


def base_manifest(kind: str, data: TrainData, opts: ProxyOptions, net: NetConfig, seed: int
                  ) -> Manifest:
    y = lengths(data.train)
    prompt_chars = np.asarray([len(r) for r in rendered(data.train)], np.float64)
    return Manifest(kind=kind, encoder=opts.encoder, encoder_max_tokens=opts.encoder_max_tokens,
                    net=net, train_mean=float(y.mean()), quintiles=quintiles(y),
                    baseline_linear=list(linear_fit(prompt_chars, y)),
                    chars_per_token=chars_per_token(data.train), seed=seed)


def train_proxy(data: TrainData, opts: ProxyOptions, tc: TrainConfig, out: Path) -> Manifest:
    t0 = time.perf_counter()
    bagger = BagTokenizer(opts.encoder)
    encoder = TextEncoder(opts.encoder, opts.encoder_max_tokens) if opts.use_encoder else None
    train_rows = build_rows(data.train, bagger, opts, encoder, "train")
    dev_rows = build_rows(data.dev, bagger, opts, encoder, "dev") if data.dev else None
    cfg = NetConfig(table_size=bagger.table_size, num_numeric=len(NUMERIC_NAMES),
                    emb_dim=encoder.dim if encoder else 0, bag_dim=opts.bag_dim,
                    hidden=opts.hidden, quantiles=opts.quantiles,
                    members=opts.members)
    y = lengths(data.train)
    net = fit_members(cfg, train_rows, np.log1p(y), tc, desc="train proxy")
    manifest = base_manifest("proxy", data, opts, cfg, tc.seed)
    cal = calibration(scores(net, train_rows), y)
    dev: dict[str, float] = {}
    offsets: list[float] = []
    if dev_rows is not None:
        dev_out = all_outputs(net, dev_rows).astype(np.float64)
        dev_y = lengths(data.dev)
        dev = quality(np.maximum(cal * np.expm1(dev_out[:, 0]), 1.0), dev_y, manifest.quintiles)
        offsets = conformal_offsets(dev_out, cfg.quantiles, dev_y)
        dev |= {f"{k}_raw": v for k, v in quantile_metrics(dev_out, cfg.quantiles, dev_y).items()}
        dev |= quantile_metrics(shifted(dev_out, offsets), cfg.quantiles, dev_y)  # fitted on dev
        first = np.asarray([is_first_turn(r) for r in data.dev])
        if first.any():
            first_pred = np.maximum(cal * np.expm1(dev_out[first, 0]), 1.0)
            dev["first_kendall_tau"] = quality(first_pred, dev_y[first],
                                               manifest.quintiles)["kendall_tau"]
    out.mkdir(parents=True, exist_ok=True)
    save_net(net, out)
    manifest = msgspec.structs.replace(manifest, calibration=cal, dev_metrics=dev,
                                       quantile_offsets=offsets,
                                       train_seconds=time.perf_counter() - t0)
    write_manifest(out, manifest)
    return manifest
