"""Router-style placements for scheduler.placement (a benchmark knob); the policy's own
choice is the default (make_policy applying the knob: test_policysetup.py)."""

from __future__ import annotations

import pytest

from daemon.core import placement
from daemon.core.placement import RoundRobin, least_queue
from tests.policies.fakes import FakeExecutor, job, work_vs_queue_pair


def test_least_queue_counts_jobs_not_predicted_work() -> None:
    a, b = work_vs_queue_pair()
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


def test_unknown_placement_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown placement"):
        placement.make("random")
