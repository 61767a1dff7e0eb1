"""Retrieval keys: a lexical TF-IDF vector, randomly projected to a small dense unit vector.

Cosine of random projections approximates cosine of the TF-IDF vectors (Johnson-
Lindenstrauss), so near-duplicate requests score ~1 while unrelated ones score ~0 -- and a
key costs about a millisecond, unlike a transformer pass on this CPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from predictor.features import BagTokenizer
from predictor.records import Turn, render

KEY_DIM = 256
PROJECTION_SEED = 20240917  # fixed: keys must not change between runs


class LexicalKeyer:
    def __init__(self, bagger: BagTokenizer, idf: np.ndarray, dim: int = KEY_DIM) -> None:
        self.bagger = bagger
        self.idf = idf.astype(np.float32)
        rng = np.random.default_rng(PROJECTION_SEED)
        # int8 signs: 63k x 256 bytes instead of 4x that in float32
        self.projection = rng.choice(np.array([-1, 1], np.int8), size=(bagger.table_size, dim))
        self.dim = dim

    def keys(self, conversations: Sequence[Sequence[Turn]]) -> np.ndarray:
        bag = self.bagger.bag([render(m) for m in conversations])
        ends = list(bag.offsets[1:]) + [len(bag.ids)]
        out = np.zeros((len(conversations), self.dim), np.float32)
        for row, (s, e) in enumerate(zip(bag.offsets, ends)):
            ids, counts = np.unique(bag.ids[s:e], return_counts=True)
            weights = (1.0 + np.log(counts)) * self.idf[ids]
            out[row] = weights @ self.projection[ids].astype(np.float32)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-9)


def fit_idf(bagger: BagTokenizer, conversations: Sequence[Sequence[Turn]]) -> np.ndarray:
    """Smoothed inverse document frequency over the training conversations."""
    bag = bagger.bag([render(m) for m in conversations])
    ends = list(bag.offsets[1:]) + [len(bag.ids)]
    df = np.zeros(bagger.table_size, np.float64)
    for s, e in zip(bag.offsets, ends):
        df[np.unique(bag.ids[s:e])] += 1
    return np.log((1 + len(conversations)) / (1 + df)).astype(np.float32) + 1.0
