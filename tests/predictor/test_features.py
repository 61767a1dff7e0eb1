"""What the nets see: word-piece bags with hashed bigrams, numeric and partial-answer signals,
FeatureRows sliced into batches, the packaged encoder's path and the embedding cache."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.features import (
    MAX_BAG_TOKENS,
    NUM_PARTIAL,
    NUMERIC_NAMES,
    BagTokenizer,
    EmbeddingCache,
    add_partials,
    attach_embeddings,
    featurize,
    numeric_features,
    partial_features,
    resolve_encoder_path,
)
from predictor.records import Message


@pytest.fixture(scope="module")
def bagger() -> BagTokenizer:
    return BagTokenizer("minilm")


def test_bag_holds_pieces_then_bigrams_of_the_last_pieces(bagger) -> None:
    bag = bagger.bag(["hello world again", "", "word " * 2000])
    assert bag.offsets.tolist()[:2] == [0, 5] and bag.offsets[2] == 6  # 3 pieces + 2 bigrams
    first = bag.ids[:5]
    assert (first[:3] < bagger.vocab_size).all() and (first[3:] >= bagger.vocab_size).all()
    assert bag.ids[5] == 0  # an empty text still has one row
    assert len(bag.ids) - bag.offsets[2] == 2 * MAX_BAG_TOKENS - 1
    assert (bag.ids < bagger.table_size).all()


def test_numeric_features_read_the_conversation() -> None:
    turns = [Message("system", "s"), Message("user", "q1"), Message("assistant", "a" * 9),
             Message("user", "def f(): ```")]
    got = dict(zip(NUMERIC_NAMES, numeric_features(turns)))
    assert got["log_prompt_chars"] == pytest.approx(np.log1p(12))
    assert got["user_turns"] == pytest.approx(np.log1p(2))
    assert got["log_prev_reply_chars"] == pytest.approx(np.log1p(9))
    assert got["has_code"] == got["has_system"] == got["has_prev_reply"] == 1.0
    assert numeric_features([]) == [0.0] * len(NUMERIC_NAMES)
    partial = partial_features("a\n```py\nx", 7)
    assert len(partial) == NUM_PARTIAL and partial[0] == pytest.approx(np.log1p(7))
    assert partial[3] == 1.0  # inside an open code block


def test_rows_slice_into_net_batches(bagger) -> None:
    conversations = [[Message("user", "hi")], [Message("user", "q"), Message("assistant", "a"),
                                              Message("user", "longer question here")]]
    rows = featurize(bagger, conversations)
    assert len(rows) == 2 and rows.numeric.shape == (2, len(NUMERIC_NAMES))
    x = rows.batch([1])
    assert x.numeric.shape == (1, len(NUMERIC_NAMES)) and x.emb is None and x.out_ids is None
    assert x.prompt_offsets.tolist() == [0] and len(x.prompt_ids) == len(rows.prompt_bags[1])
    with_partial = add_partials(bagger, rows, ["so far", ""], [2, 0])
    assert with_partial.numeric.shape == (2, len(NUMERIC_NAMES) + NUM_PARTIAL)
    assert with_partial.batch([0, 1]).out_offsets is not None


def test_encoder_path_is_the_package_or_a_local_folder(tmp_path) -> None:
    assert (resolve_encoder_path("minilm") / "config.json").exists()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        resolve_encoder_path(str(tmp_path))


class _CountingEncoder:
    """Stands in for TextEncoder: a text's embedding is its length, twice."""

    dim = 2

    def __init__(self) -> None:
        self.seen: list[str] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        self.seen += texts
        return np.asarray([[len(t), -len(t)] for t in texts], np.float32)


def test_embedding_cache_embeds_each_text_once(tmp_path) -> None:
    encoder = _CountingEncoder()
    got = EmbeddingCache(tmp_path).embed(encoder, ["ab", "c", "ab"], chunk=1)  # type: ignore[arg-type]
    assert got.tolist() == [[2, -2], [1, -1], [2, -2]] and sorted(encoder.seen) == ["ab", "c"]
    again = EmbeddingCache(tmp_path)  # from disk
    assert again.embed(encoder, ["c", "ddd"]).tolist() == [[1, -1], [3, -3]]  # type: ignore[arg-type]
    assert sorted(encoder.seen) == ["ab", "c", "ddd"]
    (tmp_path / "keys.txt").write_text("only-one-key")  # a torn save: the cache starts over
    assert EmbeddingCache(tmp_path).rows == {}


def test_attach_embeddings_with_and_without_cache(bagger, tmp_path) -> None:
    rows = featurize(bagger, [[Message("user", "x")], [Message("user", "yy")]])
    attach_embeddings(rows, ["x", "yy"], _CountingEncoder(), None)  # type: ignore[arg-type]
    assert rows.emb is not None and rows.emb.tolist() == [[1, -1], [2, -2]]
    attach_embeddings(rows, ["zzz", "x"], _CountingEncoder(), tmp_path)  # type: ignore[arg-type]
    assert rows.emb.tolist() == [[3, -3], [1, -1]] and (tmp_path / "vecs.npy").exists()
    assert rows.batch([0]).emb is not None
