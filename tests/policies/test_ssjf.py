"""SSJF and its oracle: shortest predicted (or true) remaining length first, never preempting."""

from __future__ import annotations

import pytest

from daemon.core.policy import class_rank
from daemon.core.waitqueue import WaitQueue
from policies.ssjf import SSJF, OracleSJF
from tests.policies import harness
from tests.policies.fakes import job
from tests.policies.harness import Spec


@pytest.mark.parametrize("policy", ["ssjf", "oracle-sjf"])
def test_sjf_never_preempts(policy: str) -> None:
    workload = [Spec(0.0, 40, 400, predicted=400.0), Spec(0.2, 40, 20, predicted=20.0)]
    result = harness.run(harness.make_config(policy, max_running=1), workload)
    assert result.by_finish() == [result.jobs[0].job_id, result.jobs[1].job_id]


def test_order_is_predicted_remaining_length_and_an_unpredicted_job_goes_last() -> None:
    policy = SSJF()
    queue = WaitQueue(policy.order_key, None)
    jobs = [job("p300", predicted=300.0), job("unknown", predicted=None, max_tokens=2048),
            job("p50", predicted=50.0),
            job("p400-done-350", predicted=400.0, generated=350)]  # 50 left, like p50
    for j in jobs:
        queue.push(j)
    assert [queue.pop(0.0).job_id for _ in jobs] == [  # type: ignore[union-attr]
        "p50", "p400-done-350", "p300", "unknown"]


def test_the_oracle_orders_by_the_truth_not_the_prediction() -> None:
    liar = job("liar", predicted=10.0, true=500, generated=100)
    honest = job("honest", predicted=300.0, true=300)
    assert SSJF().order_key(liar) < SSJF().order_key(honest)
    oracle = OracleSJF()
    assert oracle.order_key(liar) == 400.0 and oracle.order_key(honest) == 300.0
    assert not oracle.uses_predictions and oracle.benchmark_only


def test_engine_priority_keeps_classes_apart_and_orders_by_remaining_tokens() -> None:
    policy = SSJF()
    assert policy.engine_priority(job("a", predicted=42.0)) == class_rank(0, 42.0)
    assert policy.engine_priority(job("b", predicted=42.0, priority=1)) == class_rank(1, 42.0)
    assert OracleSJF().engine_priority(job("c", predicted=1.0, true=70)) == class_rank(0, 70.0)
