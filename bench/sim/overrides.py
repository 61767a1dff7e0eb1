"""The simulator's daemon Config: a TOML file, then KEY=VALUE overrides, decoded by the same
code as `lengthwise serve --config` (daemon.config.decode), so an unknown key or a wrong type
is refused with the key's name. Benchmark knobs (daemon.core.settings.BENCH_KNOB) are
allowed here: setting them is what the simulator is for.

Overrides are dotted keys into the Config tree (`scheduler.aging.promote_after_s=4`); a
value is read as a TOML value (`4`, `0.5`, `true`, `"x"`, `[1, 2]`), and as a plain string
when it is not one (`scheduler.policy=ssjf`). Keys under `sim.` set the simulated engine
(daemon.executors.settings.SimConfig), which is not part of the daemon's Config.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from daemon.config import Config, ConfigError, decode, key_error
from daemon.executors.settings import SimConfig

# What the simulator needs whatever the file says, unless overridden: no 429s (every job of
# the workload is served) and a simulated engine.
SIM_DEFAULTS = ("engine.kind=sim", "scheduler.max_waiting=1000000000")
SIM_PREFIX = "sim."  # overrides of the simulated engine, not of the Config
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def parse_override(item: str) -> tuple[list[str], Any]:
    """'a.b.c=VALUE' -> (['a', 'b', 'c'], value)."""
    key, sep, raw = item.partition("=")
    path = key.strip().split(".")
    if not sep or not all(_BARE_KEY.match(part) for part in path):
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE with a dotted KEY")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return path, value


def apply(tree: dict[str, Any], items: Iterable[str]) -> dict[str, Any]:
    """Sets each override in a nested dict (in place; later items win)."""
    for item in items:
        path, value = parse_override(item)
        node = tree
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {item!r}: {part} is a value, not a section")
            node = child
        node[path[-1]] = value
    return tree


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(value, float):
        return repr(value).replace("Infinity", "inf")
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return str(value)


def to_toml(tree: dict[str, Any], prefix: str = "") -> str:
    """A nested dict as TOML dotted keys (one line per leaf)."""
    lines = []
    for key, value in tree.items():
        if isinstance(value, dict):
            lines.append(to_toml(value, f"{prefix}{key}."))
        else:
            lines.append(f"{prefix}{key} = {_toml_value(value)}")
    return "\n".join(line for line in lines if line)


def build_config(base: Path | None = None, overrides: Sequence[str] = (),
                 sim_defaults: bool = True) -> Config:
    """Config from an optional TOML file with overrides on top, validated as a file is."""
    try:
        tree = tomllib.loads(base.read_text()) if base else {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{base}: {exc}") from None
    if sim_defaults:
        _fill(tree, SIM_DEFAULTS)
    apply(tree, overrides)
    scheduler = tree.get("scheduler", {})
    engine = tree.setdefault("engine", {})
    if (isinstance(engine, dict) and isinstance(scheduler, dict)
            and isinstance(scheduler.get("max_running"), int)):
        # The simulated engine has no batch cap of its own: let max_running through.
        engine.setdefault("max_num_seqs", scheduler["max_running"])
    return decode(to_toml(tree), f"{base} with --set" if base else "--set", bench_knobs=True)


def split_sim(items: Sequence[str]) -> tuple[list[str], list[str]]:
    """(config overrides, `sim.KEY=VALUE` overrides of the simulated engine)."""
    sim = [item for item in items if item.strip().startswith(SIM_PREFIX)]
    return [item for item in items if item not in sim], sim


def build_sim(base: SimConfig, overrides: Sequence[str] = ()) -> SimConfig:
    """The simulated engine: `base` with `sim.KEY=VALUE` overrides, checked as a file is."""
    tree = apply({"sim": msgspec.structs.asdict(base)}, overrides)
    try:
        return msgspec.convert(tree, type=_Sim).sim
    except msgspec.ValidationError as exc:
        raise ConfigError(f"--set: {key_error(exc, tree)}") from None


class _Sim(msgspec.Struct, forbid_unknown_fields=True):
    sim: SimConfig



def _fill(tree: dict[str, Any], defaults: Iterable[str]) -> None:
    for item in defaults:
        path, value = parse_override(item)
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node.setdefault(path[-1], value)
