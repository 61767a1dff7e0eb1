"""A policy built from a Config: its `[policies.*]` section, the engine's cost model
(`[costmodel] profile` or the generic one: the prior the core's clock starts from and replaces)
and the jobs one executor runs at once (`scheduler.max_running`, or `engine.max_num_seqs`
under "auto" until the core knows better). The policies themselves never see the Config
(they import only daemon.core)."""

from __future__ import annotations

import logging

from daemon.config import Config, cost_model, slots_per_engine
from daemon.core import placement
from daemon.core.costmodel import CostModel
from daemon.core.policy import Policy
from policies import registry

log = logging.getLogger(__name__)


def make_policy(config: Config, name: str | None = None, cost: CostModel | None = None) -> Policy:
    """Policy `name` (default: scheduler.policy) with the config's parameters for it,
    estimating with `cost` (default: the config's cost model; the simulator passes its
    engine's)."""
    name = name or config.scheduler.policy
    section = registry.policy_class(name).params_section
    params = getattr(config.policies, section) if section else None
    cost = cost or cost_model(config)
    policy = registry.create(name, params, cost, slots_per_engine(config))
    policy.placement = placement.make(config.scheduler.placement)
    if getattr(params, "offload", False) and not config.kvstore.enabled:
        log.warning("policies.%s.offload is on but [kvstore] is not enabled: preempted jobs'"
                    " KV is not saved (set kvstore.enabled = true)", section)
    return policy
