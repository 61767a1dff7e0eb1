"""ALISE's estimated wait time (work ahead, capped by aging) and the KV residency plan."""

from __future__ import annotations

import numpy as np
import pytest

from daemon.core.job import KVResidency
from policies.alise_wait import Holder, estimate_waits, plan_residency, work_ahead
from tests.policies.fakes import job


def test_estimated_wait_is_work_ahead_capped_by_aging() -> None:
    classes = np.array([0.0, 0.0, 0.0, 1.0])
    keys = np.array([1.0, 2.0, 6.0, 0.5])
    work = np.array([2.0, 4.0, 1.0, 8.0])
    ahead = work_ahead(classes, keys, work, np.array([0.0, 1.0, 0.0]), np.array([6.0, 0.6, 0.0]))
    # class 0 key 6: the two better keys of class 0; class 1 key 0.6: all of class 0, then
    # 0.5 < 0.6; class 0 key 0: nothing.
    assert ahead.tolist() == [6.0, 15.0, 0.0]
    ahead = np.array([6.0, 8.0, 12.0])  # running 6 s + the waiting work ahead of each
    levels = np.array([1.0, 2.0, 6.0])
    promote_in = np.array([50.0, 50.0, 1.5])
    # Levels 1 and 2 are already at or below the bar (3.0): aging puts them next -> 0.
    # The third: work ahead 12 / 2 servers = 6 s; aging (6 - 3) x 10 = 30 s; hard 1.5 s.
    ewt = estimate_waits(ahead, levels, promote_in, servers=2, run_level=3.0,
                         age_threshold_s=10.0)
    assert ewt.tolist() == pytest.approx([0.0, 0.0, 1.5])
    ewt = estimate_waits(ahead, levels, None, 2, None, 10.0)
    assert ewt.tolist() == pytest.approx([3.0, 4.0, 6.0])  # only the work ahead


def test_residency_keeps_up_to_the_limit_per_executor() -> None:
    def held(jid: str, where: str, level: float, ewt: float) -> Holder:
        return Holder(job(jid, executor=where, dispatches=1, generated=5), level, ewt)

    holders = [held("a", "sim0", 3.5, 9.0), held("b", "sim0", 2.2, 5.0),
               held("c", "sim0", 2.9, 1.0), held("d", "sim1", 7.0, 0.0)]
    plan = plan_residency(holders, limit_per_executor=2, offload=False)
    # sim0: level 2 (b, c by EWT: c first) fills the limit; a (level 3) is dropped.
    assert plan == {"c": KVResidency.KEEP, "b": KVResidency.KEEP, "a": KVResidency.DROP,
                    "d": KVResidency.KEEP}
    assert plan_residency(holders, 1, offload=True)["b"] is KVResidency.OFFLOAD
