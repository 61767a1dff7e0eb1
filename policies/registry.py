"""Name -> policy class. The core never names a concrete policy; config does, through here."""

from __future__ import annotations

from daemon.config import Config
from daemon.core import placement
from daemon.core.policy import Policy
from daemon.costprofile import cost_model
from policies.alise import ALISE
from policies.fcfs import FCFS
from policies.isrtf import ISRTF, OracleSRPT
from policies.scls import SCLS
from policies.ssjf import SSJF, OracleSJF

_POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (FCFS, SSJF, ISRTF, ALISE, SCLS, OracleSJF, OracleSRPT)}


def names() -> list[str]:
    return sorted(_POLICIES)


def create(name: str, config: Config | None = None) -> Policy:
    """A fresh policy; its parameters come from `config` ([policies.*], [costmodel] or
    [sim] for the cost model, [scheduler] for the batch size), or the defaults."""
    try:
        cls = _POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {names()}") from None
    config = config or Config()
    from_config = getattr(cls, "from_config", None)
    policy = from_config(config) if from_config is not None else cls()
    policy.cost = cost_model(config)
    policy.batch_hint = config.scheduler.max_running
    policy.placement = placement.make(config.scheduler.placement)
    return policy
