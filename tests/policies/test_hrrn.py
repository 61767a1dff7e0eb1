"""HRRN: the response ratio (wait + S) / S, priority classes first, the shortest on a tie."""

from __future__ import annotations

import pytest

from daemon.core.policy import class_rank
from policies.hrrn import HRRN
from tests.policies import harness
from tests.policies.fakes import FakeExecutor, context, job
from tests.policies.harness import Spec, first_dispatch_order


def test_hrrn_lets_a_long_job_that_waited_go_before_a_fresh_short_one() -> None:
    """HRRN: the ratio (wait + S) / S grows with waiting, so a long job that waited through
    a long run beats a short job that just arrived; ssjf takes the short one."""
    head = Spec(0.0, 40, 300, predicted=300.0)
    alone = harness.run(harness.make_config("fcfs", max_running=1), [head]).jobs[0]
    frees_at = alone.finish_time or 0.0
    workload = [head, Spec(0.01, 40, 60, predicted=60.0),
                Spec(frees_at - 0.01, 40, 5, predicted=5.0)]
    order = {policy: first_dispatch_order(harness.run(
        harness.make_config(policy, max_running=1), workload)) for policy in ("hrrn", "ssjf")}
    first, long, short = (f"j{i:03d}" for i in range(3))
    assert order["hrrn"] == [first, long, short]
    assert order["ssjf"] == [first, short, long]


def test_response_ratio_counts_the_total_wait_across_earlier_waits() -> None:
    policy = HRRN()
    j = job("j", predicted=50.0, enqueue=10.0)
    j.waited_s = 2.0  # waited 2 s before a preemption: its wait started at 8
    assert policy.response_ratio(j, 18.0, service=5.0) == pytest.approx((10.0 + 5.0) / 5.0)
    service = policy.service_s(j)
    assert policy.response_ratio(j, 18.0) == pytest.approx((10.0 + service) / service)
    assert policy.response_ratio(j, 8.0) == pytest.approx(1.0)  # no wait yet: ratio 1


def test_pick_is_class_first_then_highest_ratio_then_shortest() -> None:
    policy = HRRN()
    free = FakeExecutor("sim0")
    # Arrived together, nothing waited yet: both ratios are 1, the shorter goes first.
    short, long = job("s", predicted=10.0), job("l", predicted=400.0)
    pick = policy.next_assignment(context(policy, [long, short], [free], now=0.0))
    assert pick == (short, free)
    # The long job has waited many times its own service: its ratio beats a fresh short one.
    waited = job("w", predicted=400.0, enqueue=0.0)
    fresh = job("f", predicted=10.0, enqueue=100.0)
    pick = policy.next_assignment(context(policy, [fresh, waited], [free], now=100.0))
    assert pick is not None and pick[0] is waited
    # ... but never over a more urgent class.
    urgent = job("u", predicted=400.0, enqueue=100.0, priority=0)
    relaxed = job("r", predicted=10.0, enqueue=0.0, priority=1)
    pick = policy.next_assignment(context(policy, [relaxed, urgent], [free], now=100.0))
    assert pick is not None and pick[0] is urgent


def test_nothing_to_pick_without_a_free_slot_or_a_waiting_job() -> None:
    policy = HRRN()
    full = FakeExecutor("sim0", max_running=1).admit(job("r"))
    assert policy.next_assignment(context(policy, [job("w")], [full])) is None
    assert policy.next_assignment(context(policy, [], [FakeExecutor("sim1")])) is None


def test_engine_priority_keeps_classes_apart_and_orders_by_remaining_tokens() -> None:
    policy = HRRN()
    assert policy.engine_priority(job("a", predicted=42.0)) == class_rank(0, 42.0)
    assert policy.engine_priority(job("b", predicted=42.0, priority=1)) == class_rank(1, 42.0)
    assert policy.order_key(job("s", predicted=10.0)) < policy.order_key(job("l", predicted=90.0))
