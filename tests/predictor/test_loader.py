"""load_predictor by the manifest's kind, the shipped models, and the model fingerprint."""

from __future__ import annotations

import shutil

import pytest

from predictor.loader import (
    default_iterative_path,
    default_predictor_path,
    load_predictor,
    model_fingerprint,
)
from predictor.manifest import Manifest, read_manifest, write_manifest


def test_the_shipped_models_load_by_kind() -> None:
    assert read_manifest(default_predictor_path()).kind == "proxy"
    iterative = load_predictor(default_iterative_path())
    assert iterative.kind == "iterative" and iterative.path == default_iterative_path()


def test_an_unknown_kind_is_refused(tmp_path) -> None:
    write_manifest(tmp_path, Manifest(kind="oracle"))
    with pytest.raises(ValueError, match="unknown predictor kind 'oracle'"):
        load_predictor(str(tmp_path))


def test_fingerprint_changes_with_the_model_only(tmp_path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(default_predictor_path(), folder)
    before = model_fingerprint(folder)
    assert before == model_fingerprint(default_predictor_path())  # content, not location
    for name in ("index.lwidx", "index.lwidx.prev", "net.pt.tmp"):  # online state, temp files
        (folder / name).write_bytes(b"x")
    assert model_fingerprint(folder) == before
    (folder / "proxy").mkdir()
    (folder / "proxy" / "manifest.json").write_text("{}")  # sub-folders count
    assert model_fingerprint(folder) != before
