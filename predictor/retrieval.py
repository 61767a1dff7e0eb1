"""Retrieval predictor (ALISE): kNN over past requests, similarity-weighted mean of their
lengths; the proxy answers when too few neighbours are similar enough. Learns online.
Trained as a proxy (trained here or reused) plus an index of the training requests, with
the neighbour count, similarity threshold and blend weight tuned on dev."""

from __future__ import annotations

import itertools
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from predictor.api import PredictInput, Predictor
from predictor.dataset import TrainData, lengths
from predictor.evaluate import quality
from predictor.index import LexicalKeyer, VectorIndex, atomic_write, fit_idf, load_newest_valid
from predictor.manifest import Manifest, read_manifest, write_manifest
from predictor.proxy import ProxyOptions, ProxyPredictor, train_proxy
from predictor.records import Record
from predictor.trainer import TrainConfig

INDEX_FILE = "index.lwidx"
IDF_FILE = "idf.npy"
PROXY_DIR = "proxy"
THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
TOP_KS = (1, 2, 4, 8)
WEIGHTS = (0.5, 0.75, 1.0)

def neighbour_estimate(sims: np.ndarray, lens: np.ndarray, min_similarity: float,
                       min_neighbours: int) -> tuple[np.ndarray, np.ndarray]:
    """(hit mask [B], estimate [B]): similarity-weighted mean over neighbours above threshold."""
    ok = sims >= min_similarity
    weights = np.where(ok, np.maximum(sims, 1e-6), 0.0).astype(np.float64)
    total = weights.sum(1)
    hit = ok.sum(1) >= min_neighbours
    est = (weights * lens).sum(1) / np.maximum(total, 1e-12)
    return hit, est


def blend(neighbours: np.ndarray, proxy: np.ndarray, weight: float) -> np.ndarray:
    """Weighted geometric mean: lengths are log-normal-ish, so blend in log space."""
    n = np.log(np.maximum(neighbours, 1.0))
    return np.exp(weight * n + (1.0 - weight) * np.log(np.maximum(proxy, 1.0)))


class RetrievalPredictor(Predictor):
    kind = "retrieval"

    def __init__(self, path: Path, manifest: Manifest, proxy: ProxyPredictor,
                 keyer: LexicalKeyer, index: VectorIndex) -> None:
        self.path, self.manifest, self.proxy, self.index = path, manifest, proxy, index
        self.keyer = keyer
        self.chars_per_token = manifest.chars_per_token
        self._lock = threading.Lock()
        self.hits = 0  # served from neighbours
        self.misses = 0  # served by the proxy fallback

    @classmethod
    def load(cls, path: Path, manifest: Manifest) -> RetrievalPredictor:
        proxy_dir = path / manifest.fallback
        proxy = ProxyPredictor.load(proxy_dir, read_manifest(proxy_dir))
        keyer = LexicalKeyer(proxy.bagger, np.load(path / IDF_FILE))
        index = load_newest_valid(path / INDEX_FILE, VectorIndex.from_bytes)
        if index is None or index.dim != keyer.dim:
            index = VectorIndex(keyer.dim)  # nothing valid on disk: start empty, proxy serves
        return cls(path, manifest, proxy, keyer, index)

    def predict_detail(self, batch: list[PredictInput]) -> tuple[list[float], np.ndarray]:
        keys = self.keyer.keys([inp.messages for inp in batch])
        with self._lock:
            sims, lens = self.index.search(keys, self.manifest.top_k)
        hit, est = neighbour_estimate(sims, lens, self.manifest.min_similarity,
                                      self.manifest.min_neighbours)
        self.hits += int(hit.sum())
        self.misses += int((~hit).sum())
        # On a hit the neighbours are blended with the proxy (geometric, weight tuned on dev);
        # with weight 1 the proxy runs for the misses only, which keeps the hit path cheap.
        weight = self.manifest.neighbour_weight
        need = [i for i, h in enumerate(hit) if weight < 1.0 or not h]
        proxy = np.ones(len(batch))
        if need:
            proxy[need] = self.proxy.predict([batch[i] for i in need])
        preds = np.where(hit, blend(est, proxy, weight), proxy)
        return [float(p) for p in preds], hit

    def predict(self, batch: list[PredictInput]) -> list[float]:
        return self.predict_detail(batch)[0] if batch else []

    def predict_quantiles(self, batch: list[PredictInput],
                          qs: Sequence[float] = (0.5, 0.9)) -> list[tuple[float, ...]]:
        """The proxy's quantiles: neighbours give one length each, not a distribution."""
        return self.proxy.predict_quantiles(batch, qs)

    def observe(self, inp: PredictInput, output_tokens: int) -> None:
        keys = self.keyer.keys([inp.messages])
        with self._lock:
            self.index.add(keys, np.asarray([output_tokens]))

    def save(self) -> None:
        with self._lock:
            data = self.index.to_bytes()
        atomic_write(self.path / INDEX_FILE, data)

    def eval_extra(self, records: list[Record]) -> dict[str, float]:
        """Hit rate and the hit path's own latency (no fallback work on a hit)."""
        inputs = [PredictInput.from_record(r) for r in records]
        _, hit = self.predict_detail(inputs)
        hits = [i for i, h in zip(inputs, hit) if h][:50]
        ms: list[float] = []
        for inp in hits:
            t = time.perf_counter()
            self.predict([inp])
            ms.append((time.perf_counter() - t) * 1000.0)
        return {"hit_rate": float(hit.mean()) if len(hit) else 0.0, "index_size": len(self.index),
                "hit_p50_ms": float(np.percentile(ms, 50)) if ms else float("nan")}


def keys_of(keyer: LexicalKeyer, records: list[Record], batch: int = 512) -> np.ndarray:
    return np.concatenate([keyer.keys([r.messages for r in records[s:s + batch]])
                           for s in range(0, len(records), batch)])


def proxy_predictions(proxy: ProxyPredictor, records: list[Record], batch: int = 512
                      ) -> np.ndarray:
    return np.asarray([p for s in range(0, len(records), batch) for p in
                       proxy.predict([PredictInput.from_record(r) for r in records[s:s + batch]])])


@dataclass(slots=True)
class Tuned:
    top_k: int
    min_similarity: float
    neighbour_weight: float
    dev: dict[str, float]


def tune(index: VectorIndex, dev_keys: np.ndarray, dev_fallback: np.ndarray, dev_y: np.ndarray,
         bounds: list[float]) -> Tuned:
    """Grid over (k, threshold, blend weight) on dev; best Kendall tau (what SJF needs)."""
    best: Tuned | None = None
    for k in TOP_KS:
        sims, lens = index.search(dev_keys, k)
        for thr, weight in itertools.product(THRESHOLDS, WEIGHTS):
            hit, est = neighbour_estimate(sims, lens, thr, 1)
            pred = np.where(hit, blend(est, dev_fallback, weight), dev_fallback)
            m = quality(pred, dev_y, bounds) | {"hit_rate": float(hit.mean())}
            if best is None or m["kendall_tau"] > best.dev["kendall_tau"]:
                best = Tuned(k, thr, weight, m)
    assert best is not None
    return best


def train_retrieval(data: TrainData, opts: ProxyOptions, tc: TrainConfig, out: Path,
                    fallback: str) -> Manifest:
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    if fallback:
        shutil.copytree(fallback, out / PROXY_DIR, dirs_exist_ok=True)
    else:
        train_proxy(data, opts, tc, out / PROXY_DIR)
    proxy_manifest = read_manifest(out / PROXY_DIR)
    proxy = ProxyPredictor.load(out / PROXY_DIR, proxy_manifest)
    idf = fit_idf(proxy.bagger, [r.messages for r in data.train])
    np.save(out / IDF_FILE, idf)
    keyer = LexicalKeyer(proxy.bagger, idf)
    index = VectorIndex(keyer.dim)
    index.add(keys_of(keyer, data.train), lengths(data.train))
    dev_keys, dev_fallback = keys_of(keyer, data.dev), proxy_predictions(proxy, data.dev)
    tuned = tune(index, dev_keys, dev_fallback, lengths(data.dev), proxy_manifest.quintiles)
    atomic_write(out / INDEX_FILE, index.to_bytes())
    manifest = msgspec.structs.replace(
        proxy_manifest, kind="retrieval", net=None, fallback=PROXY_DIR, top_k=tuned.top_k,
        min_similarity=tuned.min_similarity, neighbour_weight=tuned.neighbour_weight,
        dev_metrics=tuned.dev, train_seconds=time.perf_counter() - t0)
    write_manifest(out, manifest)
    return manifest
