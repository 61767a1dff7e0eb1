"""What several policies share: class-aware victim choice and the oracles' true remainder."""

from __future__ import annotations

from daemon.core.job import Job, JobStatus
from policies.common import pick_victim, true_remaining
from tests.policies.fakes import job


def _left(j: Job) -> float:
    return j.predicted_remaining_tokens


def _never(candidate: Job, victim: Job) -> bool:
    return False


def _always(candidate: Job, victim: Job) -> bool:
    return True


def _running(jid: str, predicted: float, priority: int = 0) -> Job:
    return job(jid, predicted=predicted, priority=priority, status=JobStatus.RUNNING)


def test_within_a_class_the_most_work_left_is_the_victim_if_preempting_pays() -> None:
    small, big = _running("small", 50.0), _running("big", 900.0)
    candidate = job("c", predicted=10.0)
    assert pick_victim(candidate, [small, big], _left, _always) is big
    assert pick_victim(candidate, [small, big], _left, _never) is None
    asked: list[tuple[str, str]] = []

    def beats(c: Job, v: Job) -> bool:
        asked.append((c.job_id, v.job_id))
        return False

    pick_victim(candidate, [small, big], _left, beats)
    assert asked == [("c", "big")]  # only the worst is weighed
    assert pick_victim(candidate, [], _left, _always) is None


def test_classes_come_before_work() -> None:
    candidate = job("c", predicted=500.0, priority=1)
    urgent = _running("urgent", 9000.0, priority=0)  # more urgent: never a victim
    assert pick_victim(candidate, [urgent], _left, _always) is None
    relaxed = _running("relaxed", 1.0, priority=2)  # less urgent: replaced outright
    same = _running("same", 9000.0, priority=1)
    assert pick_victim(candidate, [urgent, same, relaxed], _left, _never) is relaxed
    lowest = _running("lowest", 1.0, priority=3)  # the least urgent class goes first
    assert pick_victim(candidate, [relaxed, lowest, same], _left, _never) is lowest


def test_true_remaining_is_the_truth_left_within_the_budget_else_the_budget() -> None:
    assert true_remaining(job("t", true=300, generated=100)) == 200.0
    assert true_remaining(job("over", true=300, generated=300)) == 1.0  # at least one
    assert true_remaining(job("capped", true=5000, generated=100, max_tokens=400)) == 300.0
    assert true_remaining(job("unknown", predicted=10.0, generated=100, max_tokens=400)) == 300.0
    assert true_remaining(job("spent", generated=400, max_tokens=400)) == 1.0
