"""The vector index: its bytes round trip."""

from __future__ import annotations

import numpy as np

from predictor.index import (
    VectorIndex,
)


def test_index_bytes_round_trip() -> None:
    index = VectorIndex(3)
    index.add(np.eye(3, dtype=np.float32), np.array([5, 6, 7]))
    again = VectorIndex.from_bytes(index.to_bytes())
    sims, lens = again.search(np.array([[0, 1, 0]], np.float32), 1)
    assert lens.tolist() == [[6]] and abs(sims[0, 0] - 1.0) < 1e-6
