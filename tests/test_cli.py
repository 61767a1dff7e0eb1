"""`lengthwise serve` refuses a bad config at start-up, naming the problem, exit code 2."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support import LENGTHWISE


def _serve(config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LENGTHWISE), "serve", "--config", str(config), *extra],
                          capture_output=True, text=True, timeout=60, check=False)


def test_missing_model_folder_is_a_config_error(tmp_path: Path) -> None:
    config = tmp_path / "lengthwise.toml"
    config.write_text('[model]\npath = "no/such/model"\n[engine]\nkind = "sim"\n')
    result = _serve(config)
    assert result.returncode == 2
    assert "model.path 'no/such/model' is not a model folder" in result.stdout


def test_check_names_the_bad_key(tmp_path: Path) -> None:
    config = tmp_path / "lengthwise.toml"
    config.write_text("[scheduler]\nmax_runing = 4\n")
    result = _serve(config, "--check")
    assert result.returncode == 2
    assert "max_runing" in result.stdout
