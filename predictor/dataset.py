"""Loading training data: reserved-split guard, dev hold-out, deterministic subsampling."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from predictor.records import Record, conversation_key, read_records, render
from predictor.split import Split, is_dev, split_of


@dataclass(slots=True)
class TrainData:
    train: list[Record]
    dev: list[Record]


def _order_key(record: Record) -> str:
    """Subsets are fixed by id (not by --seed) so cached embeddings stay reusable."""
    return hashlib.sha256(record.id.encode()).hexdigest()


def load_train_dev(path: str | Path, limit: int = 0, dev_limit: int = 0) -> TrainData:
    """Drops reserved-split conversations (never train on them), then holds out dev by id."""
    train: list[Record] = []
    dev: list[Record] = []
    dropped = 0
    for record in read_records(path):
        if split_of(conversation_key(record.id)) is Split.TEST:
            dropped += 1
            continue
        (dev if is_dev(record.id) else train).append(record)
    if dropped:
        print(f"dropped {dropped} records of the reserved test split", file=sys.stderr)
    train.sort(key=_order_key)
    dev.sort(key=_order_key)
    return TrainData(train=train[:limit] if limit else train, dev=dev[:dev_limit] if dev_limit else dev)


def lengths(records: list[Record]) -> np.ndarray:
    return np.asarray([r.output_tokens for r in records], dtype=np.float64)


def chars_per_token(records: list[Record]) -> float:
    chars = sum(len(r.response) for r in records)
    return chars / max(1, sum(r.output_tokens for r in records))


def rendered(records: list[Record]) -> list[str]:
    return [render(r.messages) for r in records]
