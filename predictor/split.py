"""The reserved-split rule of DESIGN.md, and the dev hold-out carved out of the training side."""

from __future__ import annotations

import enum
import hashlib

from predictor.records import conversation_key

TRAIN_DIGITS = frozenset("0123456789ab")
TEST_DIGITS = frozenset("cdef")


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
