"""scheduler.placement (a benchmark knob): the policy's own choice by default, or a
router-style one."""

from __future__ import annotations

import pytest

from daemon.config import decode
from daemon.core import placement
from daemon.core.placement import RoundRobin, least_queue
from daemon.policysetup import make_policy
from tests.policies.fakes import FakeExecutor, job


def _pair() -> tuple[FakeExecutor, FakeExecutor]:
    """'a' runs one long job, 'b' two short ones: predicted work and queue length disagree."""
    a = FakeExecutor("a", max_running=4).admit(job("x", predicted=900.0))
    b = FakeExecutor("b", max_running=4).admit(job("y", predicted=50.0),
                                               job("z", predicted=60.0))
    return a, b


def test_least_queue_counts_jobs_not_predicted_work() -> None:
    a, b = _pair()
    assert least_queue(job("n"), [a, b]) is a
    assert least_queue(job("n"), [b, a]) is a
    idle = FakeExecutor("c", max_running=4)
    assert least_queue(job("n"), [a, b, idle]) is idle


def test_round_robin_rotates_and_skips_a_full_executor() -> None:
    rr = RoundRobin()
    exs = [FakeExecutor(name) for name in "abc"]
    assert [rr(job(f"j{i}"), exs).name for i in range(6)] == list("abcabc")
    # 'b' is full: it is skipped, and the rotation goes on among the others.
    assert [rr(job(f"k{i}"), [exs[0], exs[2]]).name for i in range(3)] == list("aca")
    assert rr(job("m"), exs).name == "b"  # b waited longest once it has room again


@pytest.mark.parametrize("policy", ["fcfs", "ssjf", "alise"])
def test_make_policy_applies_the_configured_placement(policy: str) -> None:
    a, b = _pair()
    own = make_policy(decode(f'[scheduler]\npolicy = "{policy}"\n'))
    assert own.placement is None
    assert own.choose_executor(job("n"), [a, b]) is b  # least predicted outstanding work
    text = f'[scheduler]\npolicy = "{policy}"\nplacement = "least_queue"\n'
    routed = make_policy(decode(text, bench_knobs=True))  # the fleet benchmark's knob
    assert routed.choose_executor(job("n"), [a, b]) is a


def test_unknown_placement_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown placement"):
        placement.make("random")
