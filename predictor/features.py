"""Cheap per-request features: hashed bags of word pieces and a few numeric signals."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from predictor.encoder import resolve_encoder_path
from predictor.records import Turn

NUM_BIGRAM_BUCKETS = 1 << 15
MAX_BAG_TOKENS = 512  # SSJF keeps the last 512 tokens of history + prompt
NUMERIC_NAMES = ("log_prompt_chars", "log_history_chars", "user_turns", "log_prev_reply_chars",
                 "mean_log_prev_reply_chars", "has_code", "has_system", "has_prev_reply")


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


NUM_PARTIAL = 4
