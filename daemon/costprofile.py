"""The engine cost model the policies and the core's aging use: `[costmodel] profile`, a file
`lengthwise profile` writes (its fitted `sim` coefficients), or the `[sim]` section."""

from __future__ import annotations

from pathlib import Path

import msgspec

from daemon.config import Config, ConfigError, SimConfig
from daemon.core.costmodel import CostModel


class _ProfileFile(msgspec.Struct):
    """The part of a profile file (bench/costfile.Profile) the daemon reads."""

    sim: SimConfig


def cost_model(config: Config) -> CostModel:
    """Read at start and on every reload; a missing or malformed file is a ConfigError."""
    path = config.costmodel.profile
    if not path:
        return CostModel.from_sim(config.sim)
    try:
        profile = msgspec.json.decode(Path(path).read_bytes(), type=_ProfileFile)
    except OSError as exc:
        raise ConfigError(f"costmodel.profile: cannot read {path}: {exc.strerror}") from None
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ConfigError(f"costmodel.profile: {path} is not a cost profile: {exc}") from None
    return CostModel.from_sim(profile.sim)
