"""The `lengthwise` console script."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from daemon.config import Config

_HELP = """\
commands:
  serve       run the daemon (HTTP API + scheduler + engines)
  model       build a local model folder (smollm2: the default model; tiny: test model)
  predictor   output-length predictors: data, train, eval
from the benchmarks (lengthwise-bench: `pip install -e ./bench`; `make setup` installs it):
  bench       load tests: `bench run` (one server), `bench compare` (systems side by side)
  profile     measure the engine and fit the execution-time cost model
  sim         the real scheduler and policies on simulated engines, in virtual time
  chaos       operational probes against a running daemon (bad input, engine kill, overload)
"""

# command -> "module:function" taking argv and returning an exit code; imported on use so
# `lengthwise serve` never loads benchmark or training code.
_SUBCOMMANDS = {
    "model": "daemon.models:main",
    "predictor": "predictor.cli:main",
}
# Handed off to the bench package, its own distribution (bench/pyproject.toml): the daemon
# never imports it otherwise, and its wheel does not hold it.
_BENCH_COMMANDS = {
    "bench": "bench.cli:main",
    "profile": "bench.profile:main",
    "sim": "bench.sim:main",
    "chaos": "bench.chaos:main",
}
_INSTALL_BENCH = "pip install -e ./bench (from the repository's root; `make setup` does it)"


def _serve(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="lengthwise serve",
        epilog="exit codes: 2 = the config is invalid, 3 = this host lacks something the "
               "config needs (vLLM build, CUDA device, package); each problem is printed")
    parser.add_argument("--config", type=Path, default=Path("etc/lengthwise.toml"),
                        help="TOML config file (default: %(default)s)")
    parser.add_argument("--check", action="store_true",
                        help="validate the config file and this host for it, and exit")
    args = parser.parse_args(argv)
    code = _preflight(args.config, args.check)
    if code is not None:
        return code
    from daemon.lifecycle import run

    return run(args.config)


def _forks_engines(config: Config) -> bool:
    """Whether an engine of this config forks from the warm forkserver (enginefork): a vLLM
    engine on a CPU device, with start_method "forkserver"."""
    engine = config.engine
    return engine.kind == "vllm" and engine.start_method == "forkserver" and \
        any(device.startswith("cpu") for device in engine.devices)


def _preflight(config_path: Path, check: bool) -> int | None:
    """The config, then the host: an exit code, or None to go on serving."""
    from daemon import preflight
    from daemon.config import ConfigError, load

    try:
        config = load(config_path)
    except ConfigError as exc:
        print(f"lengthwise: config error: {exc}")
        return 2
    if check and (problem := preflight.model_problem(config)) is not None:
        print(f"lengthwise: config error: {config_path}: {problem}")
        return 2
    missing = preflight.problems(config)
    for problem in missing:
        print(f"lengthwise: cannot serve {config_path} here: {problem}")
    if missing:
        return 3
    if check:
        print(f"{config_path}: ok")
        return 0
    if _forks_engines(config):
        from daemon.executors import enginefork

        # Read by huggingface_hub when it is imported, next (lifecycle.run says why).
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        enginefork.fork_now()  # torch and vLLM imported once, here
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: lengthwise COMMAND [ARGS]\n\n" + _HELP)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "serve":
        return _serve(rest)
    if command in _BENCH_COMMANDS and importlib.util.find_spec("bench") is None:
        print(f"lengthwise {command}: the benchmarks (lengthwise-bench) are not installed: "
              f"{_INSTALL_BENCH}", file=sys.stderr)
        return 3
    if target := _SUBCOMMANDS.get(command) or _BENCH_COMMANDS.get(command):
        module, function = target.split(":")
        entry = getattr(importlib.import_module(module), function)
        return int(entry(rest))
    print(f"lengthwise: unknown command {command!r}\n\n{_HELP}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
