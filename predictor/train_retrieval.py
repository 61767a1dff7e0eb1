"""Training the retrieval predictor: a proxy (trained here or reused), an index of the
training requests keyed by the proxy's penultimate activations, threshold tuned on dev."""

from __future__ import annotations

import itertools
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from predictor.api import PredictInput
from predictor.dataset import TrainData, lengths
from predictor.evaluate import quality
from predictor.index import LexicalKeyer, VectorIndex, atomic_write, fit_idf
from predictor.manifest import Manifest, read_manifest, write_manifest
from predictor.proxy import ProxyOptions, ProxyPredictor, train_proxy
from predictor.retrieval import IDF_FILE, INDEX_FILE, blend, neighbour_estimate
from predictor.trainer import TrainConfig

PROXY_DIR = "proxy"
THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
TOP_KS = (1, 2, 4, 8)
WEIGHTS = (0.5, 0.75, 1.0)


def keys_of(keyer: LexicalKeyer, records, batch: int = 512) -> np.ndarray:
    return np.concatenate([keyer.keys([r.messages for r in records[s:s + batch]])
                           for s in range(0, len(records), batch)])


def proxy_predictions(proxy: ProxyPredictor, records, batch: int = 512) -> np.ndarray:
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
