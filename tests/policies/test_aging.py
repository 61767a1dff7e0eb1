"""Waits stay bounded under aging, for every policy, even when the policy would starve a job;
and the core's timer makes aging and preemption happen when no slot frees."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon.config import Config, PoliciesConfig, SimConfig
from daemon.core.costmodel import TERMS, CostModel
from daemon.core.job import Job, JobStatus
from daemon.core.policy import DispatchContext
from daemon.policysetup import make_policy
from policies import registry
from policies.alise import ALISEParams
from policies.fcfs import FCFS
from policies.isrtf import ISRTFParams
from policies.scls import SCLSParams
from tests.policies import harness
from tests.policies.harness import Spec

PROMOTE_AFTER_S = 1.0
SHORT_SERVICE_S = 0.1  # upper bound on one 5-token job on the sim (prefill + 5 steps)
LONG_SERVICE_S = 1.2  # upper bound on the 100-token job, resumes included
PARAMS = PoliciesConfig(scls=SCLSParams(slice_tokens=32, min_interval_s=0.05))


def starvation_workload() -> list[Spec]:
    """One long job among a 6 s burst of short ones arriving faster than they are served."""
    shorts = [Spec(0.04 * i, 30, 5, predicted=5.0) for i in range(150)]
    return [*shorts[:1], Spec(0.02, 30, 100, predicted=100.0), *shorts[1:]]


def long_job(result: harness.Result) -> Job:
    return next(job for job in result.jobs if job.true_output_tokens == 100)


def fcfs_worst_wait() -> float:
    result = harness.run(harness.make_config("fcfs", max_running=1), starvation_workload())
    return max(d.waited_s for d in result.dispatches)


@pytest.mark.parametrize("policy", registry.names())
def test_waits_are_bounded_by_aging(policy: str) -> None:
    """The job the policy would starve is promoted and served within the threshold; no
    job waits longer than under FCFS plus the threshold plus one long job's service (in an
    overload burst every policy's waits grow: aging bounds them relative to FCFS's)."""
    config = harness.make_config(policy, max_running=1, promote_after_s=PROMOTE_AFTER_S,
                                 policies=PARAMS)
    result = harness.run(config, starvation_workload())
    assert result.drained
    long = long_job(result)
    first = next(d for d in result.dispatches if d.job_id == long.job_id)
    assert first.waited_s <= PROMOTE_AFTER_S + SHORT_SERVICE_S
    worst = max(d.waited_s for d in result.dispatches)
    assert worst <= fcfs_worst_wait() + PROMOTE_AFTER_S + LONG_SERVICE_S
    assert long.num_preemptions <= (make_policy(config, policy).max_preemptions or 0)


@pytest.mark.parametrize("policy", ["ssjf", "isrtf", "alise", "scls", "oracle-sjf"])
@pytest.mark.parametrize("lookahead", [False, True])
def test_relative_bound_holds_for_the_job_a_policy_would_starve(policy: str,
                                                                lookahead: bool) -> None:
    """With the bound on the workload's time scale (slowdown x typical service time), the
    long job starts within its bound plus one short job's service; with the look-ahead
    guard it starts within its bound (it acts before a deadline passes, not after)."""
    config = harness.make_config(policy, max_running=1, promote_after_s=60.0,
                                 policies=PARAMS, slowdown=6.0, preempt=True,
                                 lookahead=lookahead)
    result = harness.run(config, starvation_workload())
    assert result.drained
    long = long_job(result)
    first = next(d for d in result.dispatches if d.job_id == long.job_id)
    assert first.bound_s is not None and first.bound_s < 5.0  # far below the 60 s backstop
    slack = 1e-6 if lookahead else SHORT_SERVICE_S
    assert first.waited_s <= first.bound_s + slack


def overload_workload() -> list[Spec]:
    """Short and long jobs, alternating, arriving 1.5x faster than one slot serves them:
    the queue grows for the whole run, as in a burst above capacity."""
    return [Spec(0.08 * i, 30, 60 if i % 2 else 5, predicted=60.0 if i % 2 else 5.0)
            for i in range(80)]


def _mean_short_wait(config: Config) -> tuple[float, harness.Result]:
    """Mean wait of the overload's short jobs under `config`, and the run."""
    result = harness.run(config, overload_workload())
    assert result.drained
    shorts = {job.job_id for job in result.jobs if job.true_output_tokens == 5}
    waits = [d.waited_s for d in result.dispatches if d.job_id in shorts]
    return sum(waits) / len(waits), result


def _ssjf(overtaking: bool, slowdown: float = 2.0) -> Config:
    return harness.make_config("ssjf", max_running=1, promote_after_s=60.0, slowdown=slowdown,
                               lookahead=True, overtaking=overtaking)


def _overtakes(result: harness.Result) -> dict[str, int]:
    """For each job: how many jobs that arrived after it started before it."""
    arrival = {job.job_id: job.arrival_time for job in result.jobs}
    started: list[str] = []
    out: dict[str, int] = {}
    for d in result.dispatches:
        if d.job_id not in out:
            out[d.job_id] = sum(arrival[other] > arrival[d.job_id] for other in started)
            started.append(d.job_id)
    return out


def test_a_queue_does_not_turn_aging_into_fcfs() -> None:
    """In an overload every wait outgrows slowdown x the typical service, so a bound in
    seconds promotes every job, earliest deadline (arrival) first, and short jobs wait as
    under FCFS. Bounded overtaking counts places instead: a job is overtaken by at most
    slowdown x (jobs running together) later arrivals, here 8 x 1, then goes in arrival
    order. SJF's order holds within that and short jobs wait far less. (One slot is the
    extreme: on an engine running a dozen jobs at once, slowdown 2 lets 24 by.)"""
    counted, result = _mean_short_wait(_ssjf(True, slowdown=8.0))
    uniform, _ = _mean_short_wait(_ssjf(False))
    fcfs_mean, fcfs = _mean_short_wait(harness.make_config(
        "fcfs", max_running=1, promote_after_s=60.0, slowdown=8.0, overtaking=True))
    assert all(job.overtake_budget is None for job in fcfs.jobs)  # its order is its bound
    assert uniform > 0.7 * fcfs_mean  # promoted by age: FCFS's order, near FCFS's waits
    assert counted < 0.6 * uniform
    overtakes = _overtakes(result)
    assert max(overtakes.values()) <= 8
    assert sum(n == 8 for n in overtakes.values()) >= 10  # the bound is what held them


def test_a_budget_on_the_place_in_line_grows_with_the_queue() -> None:
    """overtake_base = "place": a job's budget is slowdown x (jobs running together + jobs
    waiting when it arrived), so in the overload (the queue grows for the whole run) later
    jobs may be overtaken more, SJF's order holds longer and short jobs wait less than under
    the fixed budget; the bound still holds for each job."""
    fixed, _ = _mean_short_wait(harness.make_config(
        "ssjf", max_running=1, promote_after_s=60.0, slowdown=0.5, lookahead=True,
        overtaking=True))
    placed, result = _mean_short_wait(harness.make_config(
        "ssjf", max_running=1, promote_after_s=60.0, slowdown=0.5, lookahead=True,
        overtaking=True, overtake_base="place"))
    budgets = [job.overtake_budget or 0 for job in sorted(result.jobs,
                                                          key=lambda j: j.arrival_time)]
    assert budgets[0] == 1 and max(budgets[-20:]) >= 5  # the queue grew
    assert placed < 0.8 * fixed
    overtakes = _overtakes(result)
    assert all(overtakes[job.job_id] <= (job.overtake_budget or 0) for job in result.jobs)


@pytest.mark.parametrize("policy", ["ssjf", "isrtf", "alise", "oracle-sjf", "oracle-srpt"])
def test_without_aging_the_long_job_starves(policy: str) -> None:
    """The control: the workload above does starve length-aware policies without aging."""
    result = harness.run(harness.make_config(policy, max_running=1), starvation_workload())
    long = long_job(result)
    assert (long.finish_time or 0) - long.arrival_time > 5.0


def test_alise_virtual_aging_preempts_without_any_event() -> None:
    """B (longer) waits behind A; nothing arrives or ends, yet B's aged priority overtakes
    A's remaining time and B preempts A: the policy's review timer drives the decision."""
    params = PoliciesConfig(alise=ALISEParams(age_threshold_s=0.3, review_interval_s=0.1))
    config = harness.make_config("alise", max_running=1, policies=params)
    workload = [Spec(0.0, 40, 400, predicted=400.0), Spec(0.01, 40, 600, predicted=600.0)]
    result = harness.run(config, workload)
    a, b = result.jobs
    assert a.num_preemptions >= 1  # (A, aging in turn, may take its place back: bounded)
    assert (b.first_token_time or 0) < (a.finish_time or 0)
    assert max(a.num_preemptions, b.num_preemptions) <= ALISEParams().max_preemptions


class _Counting(FCFS):
    """FCFS that asks for a round every second and counts the rounds it gets."""

    def __init__(self, *args: object) -> None:
        super().__init__()
        self.rounds: list[float] = []

    def after_round(self, ctx: DispatchContext) -> float | None:
        self.rounds.append(ctx.now)
        return ctx.now + 1.0 if ctx.now < 5.0 else None


def test_policy_wakeups_drive_rounds_with_no_events() -> None:
    registry._POLICIES["counting"] = _Counting
    try:
        result = harness.run(harness.make_config("counting"), [Spec(0.0, 10, 700)])
    finally:
        del registry._POLICIES["counting"]
    policy = result.scheduler.policy
    assert isinstance(policy, _Counting)
    timed = [t for t in policy.rounds if 0.5 < t < 5.5]
    assert [round(t) for t in timed] == [1, 2, 3, 4, 5]
    assert result.drained


def test_aging_counts_total_wait_across_preemptions_and_protects_promoted_jobs() -> None:
    """A long job preempted again and again by short arrivals accumulates its waits; once
    they add up to the threshold it is promoted and never preempted again."""
    params = PoliciesConfig(isrtf=ISRTFParams(max_preemptions=50))
    config = harness.make_config("isrtf", max_running=1, promote_after_s=0.5,
                                 policies=params)
    workload = [Spec(0.0, 30, 600, predicted=600.0)]
    workload += [Spec(0.3 * (i + 1), 30, 10, predicted=10.0) for i in range(30)]
    result = harness.run(config, workload)
    long = result.jobs[0]
    runs = [d for d in result.dispatches if d.job_id == long.job_id]
    total = 0.0
    for k, d in enumerate(runs):
        total += d.waited_s
        if total >= 0.5:
            assert k == len(runs) - 1, "preempted after its total wait reached the threshold"
            break
    assert 2 <= long.num_preemptions < 50
    assert long.waited_s == pytest.approx(sum(d.waited_s for d in runs))
    assert long.status is JobStatus.FINISHED


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["ssjf", "isrtf", "alise", "hrrn", "oracle-sjf"]),
       speed=st.sampled_from([0.25, 0.5, 2.0, 4.0]), slowdown=st.sampled_from([2.0, 4.0, 8.0]),
       max_running=st.integers(1, 3), load=st.floats(0.6, 1.5), lookahead=st.booleans())
def test_the_bound_is_in_the_engines_learned_seconds(policy: str, speed: float, slowdown: float,
                                                     max_running: int, load: float,
                                                     lookahead: bool) -> None:
    """The engine runs `speed` x slower or faster than the configured cost model (the
    clock's prior). The job a policy would starve, among shorts arriving at `load` x what
    the slots serve, starts within its aging bound in the engine's learned seconds plus one
    short job's service (none with the look-ahead guard); without the clock its deadline
    would stay in prior seconds, up to 4x off."""
    prior = SimConfig()
    engine = SimConfig(**{term: getattr(prior, term) * speed for term in TERMS})
    truth = CostModel.from_sim(engine)
    short_s = truth.wall_s(30, 30, 5, max_running)
    gap = short_s / max_running / load
    shorts = [Spec(gap * i, 30, 5, predicted=5.0) for i in range(int(3.0 * speed / gap) + 20)]
    workload = [*shorts[:1], Spec(gap / 2, 30, 100, predicted=100.0), *shorts[1:]]
    config = harness.make_config(policy, max_running=max_running, promote_after_s=600.0,
                                 policies=PARAMS, slowdown=slowdown, preempt=True,
                                 lookahead=lookahead)
    result = harness.run(config, workload, engine=engine)
    assert result.drained
    clock = result.scheduler.lanes[0].clock
    assert clock.decode_step_s(2, 100) == pytest.approx(truth.step_s(0, 2, 100), rel=0.02)
    long = long_job(result)
    first = next(d for d in result.dispatches if d.job_id == long.job_id)
    assert first.bound_s is not None
    # The bound is slowdown x the typical service in learned seconds: shorts and the long
    # one, all on the engine's clock (a typical job is at most the long one).
    assert first.bound_s <= slowdown * truth.wall_s(30, 30, 100, max_running) * 1.01
    slack = 1e-6 if lookahead else short_s
    assert first.waited_s <= first.bound_s + slack
