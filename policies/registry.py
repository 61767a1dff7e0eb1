"""Name -> policy class. The core never names a concrete policy; config does, through here.

Each policy owns its parameter Struct (`params_type`, read from `[policies.SECTION]`);
daemon.config collects them from `sections()`, so the dependency runs one way: the daemon's
config imports the policies, the policies import only daemon.core.
"""

from __future__ import annotations

import msgspec

from daemon.core.costmodel import CostModel
from daemon.core.policy import Policy
from policies.alise import ALISE
from policies.blend import Blend, OracleBlend
from policies.fcfs import FCFS
from policies.hrrn import HRRN
from policies.isrtf import ISRTF, OracleSRPT
from policies.scls import SCLS
from policies.ssjf import SSJF, OracleSJF

_POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (FCFS, SSJF, HRRN, ISRTF, ALISE, SCLS, Blend, OracleSJF, OracleSRPT,
                              OracleBlend)}


def names() -> list[str]:
    return sorted(_POLICIES)


def benchmark_only(name: str) -> bool:
    """Whether policy `name` needs what only benchmarks know (the oracles' true lengths)."""
    return bool(getattr(policy_class(name), "benchmark_only", False))


def policy_class(name: str) -> type[Policy]:
    try:
        return _POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {names()}") from None


def sections() -> dict[str, type[msgspec.Struct]]:
    """`[policies.SECTION]` name -> its parameter Struct type, in registry order."""
    found: dict[str, type[msgspec.Struct]] = {}
    for cls in _POLICIES.values():
        if cls.params_type is not None:
            found.setdefault(cls.params_section, cls.params_type)
    return found


def create(name: str, params: msgspec.Struct | None = None, cost: CostModel | None = None,
           max_running: int = 4) -> Policy:
    """A fresh policy: `params` is its section (None: the defaults), `cost` the engine's
    cost model (None: the generic one), `max_running` the jobs one executor runs at once.
    daemon.policysetup.make_policy takes all three from a Config."""
    return policy_class(name)(params, cost, max_running)
