"""The simulator: the real scheduler core and policies on simulated engines, in virtual time.

`run` simulates one workload under one config; `overrides` builds that config from the
daemon's TOML plus KEY=VALUE overrides; `predictions` says what the simulated predictor
knows; `overhead` times decision rounds; `cli` is `lengthwise sim`.
"""

from __future__ import annotations

from bench.sim.cli import main
from bench.sim.predictions import predictions
from bench.sim.run import SimOptions, SimRun, simulate

__all__ = ["SimOptions", "SimRun", "main", "predictions", "simulate"]
