"""Vector index of past requests (faiss, inner product on unit vectors) with their lengths.

Persistence is crash-safe: write a temp file, fsync, rename over the old file, fsync the
folder. Files carry a SHA-256 trailer, so a torn or corrupt file is detected on load and the
previous generation (.prev) is used instead.
"""

from __future__ import annotations

import hashlib
import json

import faiss
import numpy as np

MAGIC = b"LWIDX1\n"


class CorruptIndex(ValueError):
    pass


class VectorIndex:
    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.faiss = faiss.IndexFlatIP(dim)
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

    def vectors(self) -> np.ndarray:
        return self.faiss.reconstruct_n(0, len(self)) if len(self) else np.zeros((0, self.dim),
                                                                                np.float32)

    def to_bytes(self) -> bytes:
        header = json.dumps({"n": len(self), "dim": self.dim}).encode() + b"\n"
        body = MAGIC + header + self.vectors().astype(np.float32).tobytes() + \
            self.lengths.astype(np.int32).tobytes()
        return body + hashlib.sha256(body).digest()

    @classmethod
    def from_bytes(cls, data: bytes) -> VectorIndex:
        body, digest = data[:-32], data[-32:]
        if not data.startswith(MAGIC) or hashlib.sha256(body).digest() != digest:
            raise CorruptIndex("bad magic or checksum (torn or corrupt write)")
        header_end = body.index(b"\n", len(MAGIC))
        header = json.loads(body[len(MAGIC):header_end])
        n, dim = int(header["n"]), int(header["dim"])
        payload = body[header_end + 1:]
        if len(payload) != n * dim * 4 + n * 4:
            raise CorruptIndex("payload size does not match header")
        index = cls(dim)
        vecs = np.frombuffer(payload[:n * dim * 4], np.float32).reshape(n, dim)
        index.add(vecs, np.frombuffer(payload[n * dim * 4:], np.int32))
        return index
