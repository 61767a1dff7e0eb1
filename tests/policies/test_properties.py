"""Property tests: every policy, random workloads on simulated executors in virtual time."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon.config import PoliciesConfig
from daemon.core.job import JobStatus
from daemon.policysetup import make_policy
from policies import registry
from policies.alise import ALISEParams
from policies.isrtf import ISRTFParams
from policies.scls import SCLSParams
from tests.policies import harness
from tests.policies.harness import Result, Spec

POLICIES = registry.names()

specs = st.builds(
    Spec,
    arrival_s=st.floats(0.0, 3.0),
    prompt_tokens=st.integers(1, 200),
    true_tokens=st.integers(1, 120),
    predicted=st.one_of(st.none(), st.floats(1.0, 300.0)),
    priority=st.sampled_from([0, 0, 0, 1]),
    max_tokens=st.integers(1, 150),
    abort_at_s=st.one_of(st.none(), st.none(), st.none(), st.floats(0.0, 5.0)),
)

policy_params = st.builds(
    PoliciesConfig,
    isrtf=st.builds(ISRTFParams, window_tokens=st.integers(1, 30),
                    margin=st.floats(0.0, 2.0), max_preemptions=st.integers(0, 3)),
    alise=st.builds(ALISEParams, age_threshold_s=st.floats(0.05, 20.0),
                    margin=st.floats(0.0, 2.0), max_preemptions=st.integers(0, 3),
                    max_resident_jobs=st.integers(0, 2), review_interval_s=st.floats(0.05, 1.0)),
    scls=st.builds(SCLSParams, slice_tokens=st.integers(1, 64),
                   min_interval_s=st.floats(0.01, 1.0), kv_capacity_tokens=st.integers(0, 800)),
)

settings_ = settings(max_examples=40, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.too_slow])


def preemption_bound(name: str, params: PoliciesConfig) -> int:
    policy = make_policy(harness.make_config(name, policies=params), name)
    return (policy.max_preemptions or 0) if policy.preemptive else 0


def check_invariants(result: Result) -> None:
    assert result.drained, "some job never ended"
    assert result.double_admissions == []
    for job in result.jobs:
        jid = job.job_id
        assert result.end_calls[jid] == 1, f"{jid} ended {result.end_calls[jid]} times"
        assert len(result.ends[jid]) == 1, f"{jid} got {len(result.ends[jid])} JobEnds"
        streamed = [tid for delta in result.deltas[jid] for tid in delta.token_ids]
        assert all(d.text != "AFTER-END" for d in result.deltas[jid]), f"{jid}: delta after end"
        assert streamed == job.generated_token_ids
        assert streamed == harness.expected_tokens(job, len(streamed)), f"{jid}: order"
        natural = min(max(job.true_output_tokens or 1, 1), job.sampling.max_tokens)
        if job.status is JobStatus.FINISHED:
            assert len(streamed) == natural, f"{jid}: {len(streamed)} tokens, not {natural}"
        else:
            assert job.status is JobStatus.ABORTED and len(streamed) <= natural
    assert [d.aging_violation for d in result.dispatches if d.aging_violation] == []


@pytest.mark.parametrize("policy", POLICIES)
@settings_
@given(workload=st.lists(specs, min_size=1, max_size=18), executors=st.integers(1, 3),
       max_running=st.integers(1, 3), promote_after=st.one_of(st.none(), st.floats(0.2, 3.0)),
       params=policy_params, slowdown=st.sampled_from([0.0, 2.0, 6.0]), guard=st.booleans())
def test_no_job_lost_duplicated_or_reordered(policy: str, workload: list[Spec], executors: int,
                                             max_running: int, promote_after: float | None,
                                             params: PoliciesConfig, slowdown: float,
                                             guard: bool) -> None:
    """Also: promoted jobs start before every other, earliest deadline first, whatever the
    bound (absolute or relative), preemption for promoted jobs and the look-ahead guard."""
    config = harness.make_config(policy, max_running=max_running,
                                 promote_after_s=promote_after, policies=params,
                                 slowdown=slowdown, preempt=guard, lookahead=guard)
    result = harness.run(config, workload, executors=executors,
                         predictor=harness.perfect_remaining)
    check_invariants(result)
    bound = preemption_bound(policy, params)
    # With preempt on, aging may also preempt a running job for a promoted one, within the
    # policy's max_preemptions when it has one (unbounded for the non-preemptive policies).
    if not guard or result.scheduler.policy.max_preemptions is not None:
        assert max(job.num_preemptions for job in result.jobs) <= bound


@pytest.mark.parametrize("policy", POLICIES)
@settings_
@given(workload=st.lists(specs, min_size=1, max_size=18), target=st.sampled_from(POLICIES),
       reload_s=st.floats(0.0, 1.0), executors=st.integers(1, 2),
       promote_after=st.one_of(st.none(), st.floats(0.2, 3.0)), params=policy_params)
def test_reload_switches_policy_and_loses_nothing(policy: str, workload: list[Spec],
                                                  target: str, reload_s: float, executors: int,
                                                  promote_after: float | None,
                                                  params: PoliciesConfig) -> None:
    before = harness.make_config(policy, promote_after_s=promote_after, policies=params)
    after = harness.make_config(target, max_running=3, promote_after_s=promote_after,
                                policies=params)
    result = harness.run(before, workload, executors=executors, reload_at=(reload_s, after),
                         predictor=harness.perfect_remaining)
    check_invariants(result)
    if result.reloaded_at is not None:  # else everything ended before the reload was due
        assert result.scheduler.policy.name == target
    bound = max(preemption_bound(policy, params), preemption_bound(target, params))
    assert max(job.num_preemptions for job in result.jobs) <= bound


@pytest.mark.parametrize("policy", POLICIES)
def test_scripted_reload_with_jobs_running_and_waiting(policy: str) -> None:
    """Every policy hands over to every other mid-run, with work on both sides of the line."""
    workload = [Spec(0.01 * i, 20 + 7 * i, 10 + (37 * i) % 90, predicted=50.0)
                for i in range(16)]
    for target in POLICIES:
        result = harness.run(harness.make_config(policy, max_running=2), workload,
                             executors=2, reload_at=(0.3, harness.make_config(target)))
        check_invariants(result)
        assert result.reloaded_at is not None and result.scheduler.policy.name == target
        assert any(job.finish_time and job.finish_time > 0.3 for job in result.jobs)
        assert all(job.status is JobStatus.FINISHED for job in result.jobs)
        assert math.isclose(result.jobs[0].arrival_time, 0.0)
