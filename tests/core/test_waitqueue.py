"""The waiting set under latency objectives: on-time jobs ahead of best effort in their
class (in the policy's order, by slack in overload), promoted when their slack runs low,
handed back at their latest start."""

from __future__ import annotations

from daemon.core.job import Job, SamplingSpec, Slo
from daemon.core.waitqueue import WaitQueue


def _job(name: str, tokens: float, priority: int = 0, ttft_s: float | None = None) -> Job:
    return Job(name, [1], SamplingSpec(max_tokens=100), arrival_time=0.0, priority=priority,
               predicted_output_tokens=tokens,
               slo=None if ttft_s is None else Slo(ttft_s=ttft_s))


def _times(job: Job) -> tuple[float, float] | None:
    """Latest start = the TTFT deadline; promoted 1 s before."""
    if job.slo is None or job.slo.ttft_s is None:
        return None
    return job.arrival_time + job.slo.ttft_s - 1.0, job.arrival_time + job.slo.ttft_s


def _queue(*jobs: Job) -> WaitQueue:
    queue = WaitQueue(lambda j: j.predicted_output_tokens or 0.0, None, _times)
    for job in jobs:
        queue.push(job)
    return queue


def _order(queue: WaitQueue) -> list[str]:
    """The ids in the order they would go at time 0 (the queue unchanged)."""
    return [job.job_id for job in queue.best(0.0, len(queue))]


def test_on_time_jobs_go_first_in_their_class_by_policy_then_by_slack_in_overload() -> None:
    best_effort, later_be = _job("be", tokens=1), _job("be2", tokens=0.5)
    relaxed, tight = _job("relaxed", 5, ttft_s=20), _job("tight", 50, ttft_s=10)
    urgent_class = _job("urgent", 99, priority=-1)
    queue = _queue(best_effort, later_be, relaxed, tight, urgent_class)
    # Best effort keeps the policy's order (shortest first here), behind every on-time job;
    # the on-time jobs too, while there is no overload.
    assert _order(queue) == ["urgent", "relaxed", "tight", "be2", "be"]
    queue.order_by_slack(True)  # overload: the on-time jobs by latest start
    assert _order(queue) == ["urgent", "tight", "relaxed", "be2", "be"]
    queue.order_by_slack(False)
    assert _order(queue) == ["urgent", "relaxed", "tight", "be2", "be"]
    popped = [job.job_id for job in iter(lambda: queue.pop(0.0), None)]
    assert popped == ["urgent", "relaxed", "tight", "be2", "be"]  # pop goes as best said


def test_a_job_low_on_slack_is_promoted_then_late() -> None:
    short_slo, long_slo = _job("short", 5, ttft_s=20), _job("long", 50, ttft_s=10)
    urgent_class = _job("urgent", 1, priority=-1)
    queue = _queue(short_slo, long_slo, urgent_class)
    queue.late_in_place = False  # [slo] late = "behind"
    assert queue.peek(8.0) is urgent_class  # class first while the long one has slack
    assert queue.peek(9.0) is long_slo  # 1 s of slack left: promoted, ahead of any class
    queue.remove(urgent_class)
    assert queue.promotion_due() == 9.0 and queue.expiry_due() == 10.0
    assert queue.expire(9.5) == []
    assert queue.expire(10.0) == [long_slo]  # it can no longer make it
    long_slo.slo_missed = True
    queue.update(long_slo)  # waits on as best effort: behind the on-time one
    assert queue.rank(long_slo) == 1 and queue.peek(9.5) is short_slo
    assert queue.expiry_due() == 20.0


def test_a_late_job_keeps_its_place_with_late_in_place() -> None:
    """[slo] late = "in-place", the default: a job that turned late stays among the on-time
    jobs of its class, by its (passed) latest start in slack order: ahead of the on-time
    jobs that arrived after it, still behind a more urgent class and ahead of best effort;
    it is not handed back again at its latest start."""
    late, fresh = _job("late", 50, ttft_s=10), _job("fresh", 5, ttft_s=10)
    fresh.arrival_time = 5.0
    best_effort, urgent_class = _job("be", 1), _job("urgent", 99, priority=-1)
    queue = _queue(late, fresh, best_effort, urgent_class)
    assert queue.late_in_place
    queue.order_by_slack(True)
    assert queue.expire(10.0) == [late]
    late.slo_missed = True
    queue.update(late)
    assert _order(queue) == ["urgent", "late", "fresh", "be"]
    assert queue.expiry_due() == 15.0  # fresh's only
    queue.late_in_place = False
    queue.update(late)  # behind: best effort, in the policy's order
    assert _order(queue) == ["urgent", "fresh", "be", "late"]


def test_best_effort_only_keeps_the_policy_order() -> None:
    jobs = [_job(str(n), n) for n in (3, 1, 2)]
    queue = _queue(*jobs)
    assert [queue.pop(0.0).job_id for _ in jobs] == ["1", "2", "3"]  # type: ignore[union-attr]
    assert queue.expiry_due() is None and queue.promotion_due() is None


def _overtaken(queue: WaitQueue, *started: Job) -> None:
    """These jobs just left to run."""
    queue.overtaken([(job.priority, queue.wait_started(job)) for job in started])


def test_a_job_overtaken_its_budget_times_goes_next_in_arrival_order() -> None:
    """Bounded overtaking: each start of a later arrival counts against every job that
    waits since earlier; at its budget a job is promoted, ahead of the policy's order,
    oldest first. Starts of earlier arrivals count against no one."""
    old, young = _job("old", 90), _job("young", 80)
    shorts = [_job(f"s{k}", 1) for k in range(3)]
    for t, job in enumerate([old, young, *shorts]):
        job.enqueue_time = float(t)
        job.overtake_budget = 2
    queue = _queue(old, young, *shorts)
    queue.overtaken([(0, -1.0)])  # a job that waited since before them all
    assert old.overtaken == young.overtaken == 0

    first = queue.pop(5.0)
    assert first is shorts[0]
    _overtaken(queue, first)
    assert (old.overtaken, young.overtaken, shorts[1].overtaken) == (1, 1, 0)
    assert queue.peek(5.0) is shorts[1]  # one overtake left: the policy's order holds

    second = queue.pop(5.0)
    _overtaken(queue, second)
    assert [queue.pop(5.0) for _ in range(3)] == [old, young, shorts[2]]


def test_starts_of_a_more_urgent_class_are_no_overtakes() -> None:
    """A job is not overtaken by a more urgent class, which goes first under FCFS too:
    were it promoted by their starts, classes would be undone under sustained load."""
    low, late = _job("low", 5, priority=1), _job("late", 5, ttft_s=1)
    late.slo_missed = True  # waits on as best effort
    for t, job in enumerate([low, late]):
        job.enqueue_time = float(t)
        job.overtake_budget = 1
    urgent = _job("urgent", 1, priority=-1)
    urgent.enqueue_time = 9.0
    queue = _queue(low, late, urgent)
    _overtaken(queue, queue.pop(10.0))  # type: ignore[arg-type]
    assert low.overtaken == late.overtaken == 0
    assert queue.promotion_due() is None

    on_time = _job("ok", 1, ttft_s=50)  # of the late job's class, still on time
    on_time.enqueue_time = 9.0
    _overtaken(queue, on_time)
    assert (low.overtaken, late.overtaken) == (0, 1)  # the late one's class: counted
    assert queue.promoted(10.0, 5) == [late]
