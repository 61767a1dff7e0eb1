"""What the retrieval predictor searches: lexical keys of requests, a vector index of them
(faiss HNSW, inner product on unit vectors) with their lengths, and its crash-safe files.

Keys: a TF-IDF vector, randomly projected to a small dense unit vector. Cosine of random
projections approximates cosine of the TF-IDF vectors (Johnson-Lindenstrauss), so
near-duplicate requests score ~1 while unrelated ones score ~0 -- and a key costs about a
millisecond, unlike a transformer pass on this CPU.

Files: write a temp file, fsync, rename over the old file (kept as .prev), fsync the folder.
Index files carry a SHA-256 trailer, so a torn or corrupt file is detected on load and the
previous generation is used instead.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import faiss
import numpy as np

from predictor.features import BagTokenizer
from predictor.records import Turn, render

T = TypeVar("T")

KEY_DIM = 256
PROJECTION_SEED = 20240917  # fixed: keys must not change between runs
MAGIC = b"LWIDX2\n"
HNSW_NEIGHBOURS = 32  # graph degree: recall vs memory
HNSW_EF_SEARCH = 64  # candidates per query: recall vs latency (~0.2 ms at 40k x 256)
HNSW_EF_CONSTRUCTION = 80


class LexicalKeyer:
    """Unit-length keys of conversations: TF-IDF over the bag pieces, projected to `dim`."""

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


class CorruptIndex(ValueError):
    pass


def _new_faiss(dim: int) -> faiss.Index:
    """HNSW graph on inner product: a flat scan of 40k keys costs ~1.4 ms, HNSW ~0.2 ms."""
    index = faiss.IndexHNSWFlat(dim, HNSW_NEIGHBOURS, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
    index.hnsw.efSearch = HNSW_EF_SEARCH
    return index


class VectorIndex:
    def __init__(self, dim: int, index: faiss.Index | None = None) -> None:
        self.dim = dim
        self.faiss = index if index is not None else _new_faiss(dim)
        self.lengths = np.zeros(0, dtype=np.int32)

    def __len__(self) -> int:
        return int(self.faiss.ntotal)

    def add(self, vectors: np.ndarray, lengths: np.ndarray) -> None:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1, self.dim)
        self.faiss.add(vectors)
        self.lengths = np.concatenate([self.lengths, np.asarray(lengths, np.int32).reshape(-1)])

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(similarities [B, k], neighbour lengths [B, k]); missing neighbours have sim -inf."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1, self.dim)
        if len(self) == 0:
            shape = (len(vectors), k)
            return np.full(shape, -np.inf, np.float32), np.zeros(shape, np.int32)
        sims, ids = self.faiss.search(vectors, min(k, len(self)))
        lens = np.where(ids >= 0, self.lengths[np.maximum(ids, 0)], 0)
        return np.where(ids >= 0, sims, -np.inf).astype(np.float32), lens

    def to_bytes(self) -> bytes:
        """Serialised graph (no rebuild at start-up) + lengths, then a SHA-256 trailer."""
        graph = faiss.serialize_index(self.faiss).tobytes()
        header = json.dumps({"n": len(self), "dim": self.dim, "graph_bytes": len(graph)})
        body = MAGIC + header.encode() + b"\n" + graph + self.lengths.astype(np.int32).tobytes()
        return body + hashlib.sha256(body).digest()

    @classmethod
    def from_bytes(cls, data: bytes) -> VectorIndex:
        body, digest = data[:-32], data[-32:]
        if not data.startswith(MAGIC) or hashlib.sha256(body).digest() != digest:
            raise CorruptIndex("bad magic or checksum (torn or corrupt write)")
        header_end = body.index(b"\n", len(MAGIC))
        header = json.loads(body[len(MAGIC):header_end])
        n, dim, size = int(header["n"]), int(header["dim"]), int(header["graph_bytes"])
        payload = body[header_end + 1:]
        if len(payload) != size + n * 4:
            raise CorruptIndex("payload size does not match header")
        graph = faiss.deserialize_index(np.frombuffer(payload[:size], np.uint8).copy())
        hnsw = faiss.downcast_index(graph)
        if not isinstance(hnsw, faiss.IndexHNSWFlat):
            raise CorruptIndex("not an HNSW index")
        hnsw.hnsw.efSearch = HNSW_EF_SEARCH  # not part of the serialised state
        index = cls(dim, graph)
        index.lengths = np.frombuffer(payload[size:], np.int32).copy()
        if len(index) != n:
            raise CorruptIndex("graph size does not match header")
        return index


def atomic_write(path: Path, data: bytes) -> None:
    """tmp + fsync + rename: a crash leaves either the old or the new file, never a mix."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    if path.exists():
        os.replace(path, path.with_name(path.name + ".prev"))
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the renames themselves durable
    finally:
        os.close(dir_fd)


def load_newest_valid(path: Path, parse: Callable[[bytes], T]) -> T | None:
    """The current file if it parses, else the previous generation, else None."""
    for candidate in (path, path.with_name(path.name + ".prev")):
        try:
            return parse(candidate.read_bytes())
        except FileNotFoundError:
            continue
        except ValueError:  # CorruptIndex and friends: try the older generation
            continue
    return None
