"""What retrieval searches: lexical keys, the HNSW index and its bytes, crash-safe files."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.features import BagTokenizer
from predictor.index import (
    CorruptIndex,
    LexicalKeyer,
    VectorIndex,
    atomic_write,
    fit_idf,
    load_newest_valid,
)
from predictor.records import Message


def test_index_bytes_round_trip() -> None:
    index = VectorIndex(3)
    index.add(np.eye(3, dtype=np.float32), np.array([5, 6, 7]))
    again = VectorIndex.from_bytes(index.to_bytes())
    sims, lens = again.search(np.array([[0, 1, 0]], np.float32), 1)
    assert lens.tolist() == [[6]] and abs(sims[0, 0] - 1.0) < 1e-6


def test_search_pads_missing_neighbours() -> None:
    index = VectorIndex(2)
    sims, lens = index.search(np.ones((2, 2), np.float32), 3)
    assert sims.shape == lens.shape == (2, 3) and np.isneginf(sims).all()
    index.add(np.asarray([[1.0, 0.0]], np.float32), np.asarray([9]))
    sims, lens = index.search(np.asarray([[1.0, 0.0]], np.float32), 3)
    assert lens[0, 0] == 9 and sims.shape[1] <= 3 and len(index) == 1


def test_corrupt_bytes_are_detected() -> None:
    index = VectorIndex(2)
    index.add(np.eye(2, dtype=np.float32), np.array([1, 2]))
    data = bytearray(index.to_bytes())
    data[20] ^= 0xFF
    for bad in (b"garbage", bytes(data), index.to_bytes()[:-1]):
        with pytest.raises(CorruptIndex):
            VectorIndex.from_bytes(bad)


def test_atomic_write_keeps_one_previous_generation(tmp_path) -> None:
    path = tmp_path / "f"
    atomic_write(path, b"one")
    atomic_write(path, b"two")
    assert path.read_bytes() == b"two" and (tmp_path / "f.prev").read_bytes() == b"one"
    assert not (tmp_path / "f.tmp").exists()

    def parse(data: bytes) -> str:
        if data.startswith(b"t"):
            return data.decode()
        raise ValueError("corrupt")

    assert load_newest_valid(path, parse) == "two"
    path.write_bytes(b"xx")  # corrupt: the previous generation answers
    (tmp_path / "f.prev").write_bytes(b"three")
    assert load_newest_valid(path, parse) == "three"
    path.unlink()
    (tmp_path / "f.prev").unlink()
    assert load_newest_valid(path, parse) is None


def test_lexical_keys_find_near_duplicates() -> None:
    bagger = BagTokenizer("minilm")
    texts = ["write a poem about the sea", "explain quantum tunnelling to a child",
             "list three prime numbers", "translate good morning into french"]
    conversations = [[Message("user", t)] for t in texts]
    keyer = LexicalKeyer(bagger, fit_idf(bagger, conversations))
    keys = keyer.keys(conversations + [[Message("user", "write a poem about the sea!")]])
    assert keys.shape == (5, keyer.dim) and np.allclose(np.linalg.norm(keys, axis=1), 1.0)
    sims = keys @ keys[4]
    assert sims[0] > 0.8 and sims[1:4].max() < 0.5
    again = LexicalKeyer(bagger, fit_idf(bagger, conversations)).keys(conversations[:1])
    assert np.array_equal(again[0], keys[0])  # fixed projection: keys do not change between runs
