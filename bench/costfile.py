"""The cost-profile file `lengthwise profile` writes, `[costmodel] profile` names and the
simulator's `--profile` reads."""

from __future__ import annotations

from pathlib import Path

import msgspec

from daemon.executors.settings import SimConfig


class Point(msgspec.Struct, frozen=True, kw_only=True):
    """One measurement: a step (or prefill) of `batch` sequences of `input_tokens` prompts,
    with `context_tokens` cached tokens in the batch in all, took `seconds`."""

    kind: str  # "prefill" | "decode"
    batch: int
    input_tokens: int
    context_tokens: int
    seconds: float
    predicted: float = 0.0  # the fitted model's value at this point


class FitReport(msgspec.Struct, frozen=True, kw_only=True):
    prefill_mape: float  # mean |relative error| of the fit over prefill points
    decode_mape: float
    prefill_max_error: float  # worst |relative error|
    decode_max_error: float


class Profile(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    source: str  # how the numbers were obtained (machine, engine, or the publication)
    max_num_seqs: int
    sim: SimConfig  # the fitted coefficients: the daemon's cost model and the simulated engine
    fit: FitReport | None = None
    points: list[Point] = msgspec.field(default_factory=list)


def load(path: str | Path) -> Profile:
    return msgspec.json.decode(Path(path).read_bytes(), type=Profile)


def save(profile: Profile, path: str | Path) -> None:
    Path(path).write_bytes(msgspec.json.format(msgspec.json.encode(profile), indent=2) + b"\n")


def toml_section(path: str | Path) -> str:
    """The lines that make the daemon use the profile at `path`."""
    return f'[costmodel]\nprofile = "{path}"'
