"""manifest.json: which kind of predictor a folder holds, the shape of its LengthNet and what
it was trained with. Torch-free, so reading a manifest (and `import predictor`) stays light."""

from __future__ import annotations

import math
import os
from pathlib import Path

import msgspec

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


class NetConfig(msgspec.Struct, frozen=True, kw_only=True):
    """LengthNet's shape."""

    table_size: int  # bag vocabulary: word pieces + hashed bigrams
    num_numeric: int
    emb_dim: int = 0  # frozen encoder embedding width; 0 = no encoder (bags + numerics only)
    bag_dim: int = 32
    hidden: int = 256
    dropout: float = 0.1
    partial: bool = False  # iterative: a third bag over the partial response
    # Quantile levels of log1p(tokens) the net also outputs (pinball loss); () = point only.
    quantiles: tuple[float, ...] = ()
    # Nets trained with seeds seed, seed+1, ...; their outputs are averaged (in log space).
    members: int = 1


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    kind: str  # "proxy" | "retrieval" | "iterative"
    format_version: int = FORMAT_VERSION
    encoder: str = "minilm"  # "minilm" (packaged) or a local HF folder
    encoder_max_tokens: int = 512
    net: NetConfig | None = None
    calibration: float = 1.0  # tokens = calibration * expm1(score): least-squares fit on train
    train_mean: float = 0.0  # baseline and last-resort fallback, tokens
    baseline_linear: list[float] = msgspec.field(default_factory=lambda: [0.0, 0.0])  # tokens = a * prompt_chars + b (baseline)
    quintiles: list[float] = []  # 20/40/60/80 % of training lengths (acc5 classes)
    chars_per_token: float = 4.0  # response chars per output token in the training data
    tokenizer: str = ""  # iterative: serving tokenizer folder, to cut answers into windows
    window: int = 50  # iterative: re-prediction window, tokens
    top_k: int = 8  # retrieval
    min_similarity: float = 0.9  # retrieval: neighbours below this are ignored
    min_neighbours: int = 1  # retrieval: fewer hits than this -> proxy fallback
    neighbour_weight: float = 1.0  # retrieval: weight of the neighbours vs the proxy on a hit
    # Per quantile level of the net: log-space shift fitted on dev so that the share of dev
    # lengths under each quantile equals its level (split conformal); [] = no shift.
    quantile_offsets: list[float] = []
    fallback: str = ""  # retrieval: sub-folder holding the proxy used on a miss
    seed: int = 0
    train_seconds: float = 0.0
    dev_metrics: dict[str, float] = {}  # finite values only (write_manifest)


def write_manifest(folder: Path, manifest: Manifest) -> None:
    """Write it atomically. A dev metric undefined on this dev set (r2 when every dev length
    is equal, a small log's tiny split) is left out: JSON has no NaN, it would be written as
    null and the model refused on load."""
    manifest = msgspec.structs.replace(manifest, dev_metrics={
        name: value for name, value in manifest.dev_metrics.items() if math.isfinite(value)})
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(manifest)))
    os.replace(tmp, folder / MANIFEST)


def read_manifest(folder: Path) -> Manifest:
    manifest = msgspec.json.decode((folder / MANIFEST).read_bytes(), type=Manifest)
    if manifest.format_version != FORMAT_VERSION:
        raise ValueError(f"{folder}: manifest format {manifest.format_version} not supported")
    return manifest
