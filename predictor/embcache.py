"""On-disk cache of encoder embeddings keyed by text hash: the encoder is the slow part."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from predictor.encoder import TextEncoder


def text_key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()


class EmbeddingCache:
    """keys.txt + vecs.npy (float16) in one folder per encoder configuration."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.rows: dict[str, np.ndarray] = {}
        keys_path, vecs_path = self.folder / "keys.txt", self.folder / "vecs.npy"
        if keys_path.exists() and vecs_path.exists():
            keys = keys_path.read_text().split()
            vecs = np.load(vecs_path)
            if len(keys) == len(vecs):  # a mismatch means a torn save: start over
                self.rows = dict(zip(keys, vecs))

    def embed(self, encoder: TextEncoder, texts: list[str], chunk: int = 512,
              progress=None) -> np.ndarray:
        """Embeds what is missing (saving every `chunk`), then returns rows in `texts` order."""
        keys = [text_key(t) for t in texts]
        missing = sorted({k: t for k, t in zip(keys, texts) if k not in self.rows}.items())
        for start in range(0, len(missing), chunk):
            part = missing[start:start + chunk]
            vecs = encoder.embed([t for _, t in part])
            self.rows.update({k: v.astype(np.float16) for (k, _), v in zip(part, vecs)})
            self.save()
            if progress is not None:
                progress.update(len(part))
        return np.stack([self.rows[k] for k in keys]).astype(np.float32) if keys else \
            np.zeros((0, encoder.dim), np.float32)

    def save(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        keys = list(self.rows)
        np.save(self.folder / "vecs.tmp.npy", np.stack([self.rows[k] for k in keys]))
        (self.folder / "keys.tmp").write_text("\n".join(keys))
        os.replace(self.folder / "vecs.tmp.npy", self.folder / "vecs.npy")
        os.replace(self.folder / "keys.tmp", self.folder / "keys.txt")
