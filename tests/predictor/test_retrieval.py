"""Retrieval: neighbour estimate and blend, online insert, persistence across restart, torn
writes, proxy fallback."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec
import numpy as np
import pytest

from predictor import PredictInput, load_predictor
from predictor.cli import main
from predictor.manifest import read_manifest, write_manifest
from predictor.records import Message
from predictor.retrieval import INDEX_FILE, blend, neighbour_estimate


@pytest.fixture(scope="module")
def trained(small_train, small_proxy, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Trained once per module; each test works on its own copy."""
    out = tmp_path_factory.mktemp("retrieval") / "r"
    assert main(["train", "--kind", "retrieval", "--data", str(small_train), "--out", str(out),
                 "--fallback", str(small_proxy), "--dev-limit", "100"]) == 0
    # Only near-identical requests count as neighbours, so the tests control hits exactly.
    manifest = read_manifest(out)
    write_manifest(out, msgspec.structs.replace(manifest, min_similarity=0.9999, top_k=4,
                                                neighbour_weight=1.0))
    return out


def _copy(trained: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(trained, tmp_path / "r"))


def _novel() -> PredictInput:
    return PredictInput(messages=[Message("user", "zq vexillology of imaginary moons, tersely")])


def test_online_insert_survives_restart(trained, tmp_path) -> None:
    folder = _copy(trained, tmp_path)
    predictor = load_predictor(folder)
    size = len(predictor.index)
    inp = _novel()
    fallback = predictor.proxy.predict([inp])[0]
    assert predictor.predict([inp]) == [fallback]  # miss -> proxy
    predictor.observe(inp, 4321)
    assert predictor.predict([inp])[0] > fallback  # now a hit near 4321
    predictor.save()
    restarted = load_predictor(folder)
    assert len(restarted.index) == size + 1
    assert abs(restarted.predict([inp])[0] - 4321) < 1.0


def test_torn_write_keeps_last_good_index(trained, tmp_path) -> None:
    folder = _copy(trained, tmp_path)
    predictor = load_predictor(folder)
    predictor.observe(_novel(), 4321)
    predictor.save()  # generation 2; generation 1 is kept as .prev
    good = len(predictor.index)
    path = folder / INDEX_FILE
    (folder / (INDEX_FILE + ".tmp")).write_bytes(path.read_bytes()[:1000])  # crash mid-write
    assert len(load_predictor(folder).index) == good
    path.write_bytes(path.read_bytes()[:-100])  # torn current file: previous generation wins
    assert len(load_predictor(folder).index) == good - 1
    path.unlink()  # crash between the two renames of atomic_write
    assert len(load_predictor(folder).index) == good - 1


def test_corrupt_index_everywhere_falls_back_to_proxy(trained, tmp_path) -> None:
    folder = _copy(trained, tmp_path)
    (folder / INDEX_FILE).write_bytes(b"garbage")
    predictor = load_predictor(folder)
    assert len(predictor.index) == 0
    inp = _novel()
    assert predictor.predict([inp]) == predictor.proxy.predict([inp])


def test_neighbour_estimate_weighs_by_similarity_above_the_threshold() -> None:
    sims = np.asarray([[0.95, 0.92, 0.5], [0.95, -np.inf, -np.inf]])
    lens = np.asarray([[100, 300, 5000], [40, 0, 0]])
    hit, est = neighbour_estimate(sims, lens, 0.9, 1)
    assert hit.tolist() == [True, True]
    assert est[0] == pytest.approx((0.95 * 100 + 0.92 * 300) / (0.95 + 0.92)) and est[1] == 40
    assert neighbour_estimate(sims, lens, 0.9, 2)[0].tolist() == [True, False]
    assert blend(np.asarray([100.0]), np.asarray([1.0]), 0.5)[0] == pytest.approx(10.0)
    assert blend(np.asarray([100.0]), np.asarray([7.0]), 1.0)[0] == pytest.approx(100.0)
