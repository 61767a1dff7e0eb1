"""`lengthwise model tiny`: the tiny test model is built from the default model's tokenizer,
published whole, kept when it exists, rebuilt on --force. (`smollm2` dequantizes the packaged
GGUF: `make models` runs it, and every engine test loads what it built.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemon.models import main


def test_tiny_model_is_built_once_with_the_given_tokenizer(
        tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "models" / "tiny"
    assert main(["tiny", "--out", str(out), "--tokenizer", str(tiny_model)]) == 0
    assert capsys.readouterr().out == f"{out}: built\n"
    built = json.loads((out / "config.json").read_text())
    assert (built["num_hidden_layers"], built["hidden_size"]) == (2, 128)
    # Token counts match the default model's: same tokenizer, one embedding row per token.
    assert (out / "tokenizer.json").read_bytes() == (tiny_model / "tokenizer.json").read_bytes()
    assert built["vocab_size"] == json.loads((tiny_model / "config.json").read_text())[
        "vocab_size"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny"]  # no half-built folder

    (out / "stale").write_text("from an older build")
    assert main(["tiny", "--out", str(out)]) == 0  # built already: kept as it is
    assert capsys.readouterr().out == f"{out}: already built\n"
    assert (out / "stale").exists()
    assert main(["tiny", "--out", str(out), "--tokenizer", str(tiny_model), "--force"]) == 0
    assert not (out / "stale").exists()  # the new build replaced the folder whole
    assert (out / "config.json").exists()
