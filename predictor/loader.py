"""load_predictor(path): reads the manifest and builds the predictor of its kind."""

from __future__ import annotations

from pathlib import Path

from predictor.api import Predictor
from predictor.manifest import read_manifest


def load_predictor(path: str | Path) -> Predictor:
    folder = Path(path)
    manifest = read_manifest(folder)
    if manifest.kind == "proxy":
        from predictor.proxy import ProxyPredictor
        return ProxyPredictor.load(folder, manifest)
    if manifest.kind == "retrieval":
        from predictor.retrieval import RetrievalPredictor
        return RetrievalPredictor.load(folder, manifest)
    if manifest.kind == "iterative":
        from predictor.iterative import IterativePredictor
        return IterativePredictor.load(folder, manifest)
    raise ValueError(f"{folder}: unknown predictor kind {manifest.kind!r}")


def default_predictor_path() -> Path:
    """The small proxy shipped in the package, so the daemon works out of the box."""
    return Path(__file__).resolve().parent / "models" / "default"


def default_iterative_path() -> Path:
    """The iterative (remaining-length) model shipped in the package, for re-predictions."""
    return Path(__file__).resolve().parent / "models" / "iterative"
