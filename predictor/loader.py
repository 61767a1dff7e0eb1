"""load_predictor(path): reads the manifest and builds the predictor of its kind."""

from __future__ import annotations

import hashlib
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


# Online state a running predictor writes into its own folder (the retrieval index and its
# previous generation): not part of the trained model, so not part of its fingerprint.
_ONLINE_STATE = ("index.lwidx", "index.lwidx.prev")


def model_fingerprint(path: str | Path) -> str:
    """SHA-256 over a model folder's files (names and contents, recursively), leaving out
    online state and temp files: it changes exactly when a new model is put in place."""
    folder = Path(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        if file.name in _ONLINE_STATE or file.name.endswith(".tmp"):
            continue
        digest.update(str(file.relative_to(folder)).encode() + b"\0")
        digest.update(file.read_bytes())
    return digest.hexdigest()
