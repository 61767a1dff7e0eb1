"""With perfect predictions, ssjf/isrtf/alise order as SJF/SRPT do (and the oracles too)."""

from __future__ import annotations

import pytest

from daemon.config import PoliciesConfig
from policies.isrtf import ISRTFParams
from policies.scls import SCLSParams
from tests.policies import harness
from tests.policies.harness import Spec, first_dispatch_order

LENGTH_AWARE = ["ssjf", "isrtf", "alise", "oracle-sjf", "oracle-srpt"]
PREEMPTIVE = ["isrtf", "alise", "oracle-srpt"]
LENGTHS = [64, 9, 150, 31, 5, 97, 18, 44]


@pytest.mark.parametrize("policy", LENGTH_AWARE)
@pytest.mark.parametrize("max_running", [1, 3])
def test_simultaneous_jobs_run_shortest_first(policy: str, max_running: int) -> None:
    workload = [Spec(0.0, 40, n, predicted=float(n)) for n in LENGTHS]
    result = harness.run(harness.make_config(policy, max_running=max_running), workload)
    by_length = sorted(result.jobs, key=lambda job: job.true_output_tokens or 0)
    assert first_dispatch_order(result) == [job.job_id for job in by_length]
    if max_running == 1:
        assert result.by_finish() == [job.job_id for job in by_length]
        assert all(job.num_preemptions == 0 for job in result.jobs)


@pytest.mark.parametrize("policy", ["fcfs", "scls"])
def test_length_blind_policies_keep_arrival_order(policy: str) -> None:
    workload = [Spec(0.001 * i, 40, n, predicted=float(n)) for i, n in enumerate(LENGTHS)]
    result = harness.run(harness.make_config(policy, max_running=1), workload)
    assert first_dispatch_order(result) == [job.job_id for job in result.jobs]


@pytest.mark.parametrize("policy", LENGTH_AWARE)
def test_priority_class_first_then_length(policy: str) -> None:
    workload = [Spec(0.0, 40, n, predicted=float(n), priority=i % 2)
                for i, n in enumerate(LENGTHS)]
    result = harness.run(harness.make_config(policy, max_running=1), workload)
    expected = sorted(result.jobs, key=lambda job: (job.priority, job.true_output_tokens or 0))
    assert result.by_finish() == [job.job_id for job in expected]


@pytest.mark.parametrize("policy", PREEMPTIVE)
def test_shorter_arrival_preempts_a_long_running_job(policy: str) -> None:
    """SRPT: a job arriving with far less work than the running job's remainder runs first."""
    workload = [Spec(0.0, 40, 400, predicted=400.0), Spec(0.2, 40, 20, predicted=20.0)]
    result = harness.run(harness.make_config(policy, max_running=1), workload)
    long, short = result.jobs
    assert result.by_finish() == [short.job_id, long.job_id]
    assert long.num_preemptions == 1
    assert (short.first_token_time or 0) - short.arrival_time < 0.1


@pytest.mark.parametrize("policy", [*PREEMPTIVE, "scls"])
def test_a_seeded_sample_is_never_cut(policy: str) -> None:
    """Its random draws restart from the seed on a resume, so it is neither preempted nor
    sliced: it runs in one dispatch where an unseeded job of the same shape is cut."""
    # scls slices only under a memory bound by default; the paper's slices cut every job.
    params = PoliciesConfig(scls=SCLSParams(slicing="always"))
    for seed in (None, 7):
        workload = [Spec(0.0, 40, 400, predicted=400.0, seed=seed),
                    Spec(0.2, 40, 20, predicted=20.0)]
        result = harness.run(harness.make_config(policy, max_running=1, policies=params),
                             workload)
        long = result.jobs[0]
        runs = [d for d in result.dispatches if d.job_id == long.job_id]
        assert (len(runs) == 1) == (seed is not None), (seed, len(runs))
        assert long.num_generated_tokens == 400


@pytest.mark.parametrize("policy", PREEMPTIVE)
def test_running_job_near_its_end_is_not_preempted(policy: str) -> None:
    """SRPT compares *remaining* work: 30 tokens left beats a new 60-token job."""
    workload = [Spec(0.0, 40, 300, predicted=300.0), Spec(2.4, 40, 60, predicted=60.0)]
    result = harness.run(harness.make_config(policy, max_running=1), workload)
    long, late = result.jobs
    assert long.num_preemptions == 0
    assert 0 < (long.finish_time or 0) < (late.first_token_time or 0)
    assert long.generated_token_ids and len(long.generated_token_ids) == 300


def test_isrtf_margin_decides_preemption() -> None:
    """A newcomer with 100 tokens vs a runner with ~190 left: preempts at margin 0.5, not 1.0."""
    workload = [Spec(0.0, 40, 200, predicted=200.0), Spec(0.1, 40, 100, predicted=100.0)]
    for margin, preempted in [(0.5, 1), (1.0, 0)]:
        params = PoliciesConfig(isrtf=ISRTFParams(margin=margin))
        result = harness.run(harness.make_config("isrtf", max_running=1, policies=params),
                             workload)
        assert result.jobs[0].num_preemptions == preempted, margin


def test_isrtf_follows_reprediction_not_first_guess() -> None:
    """The first guess says the runner is short; re-prediction at its first window reveals
    it is long, and a waiting short job takes its place (SRPT on the iterative estimate)."""
    workload = [Spec(0.0, 40, 400, predicted=5.0), Spec(0.05, 40, 30, predicted=30.0)]
    params = PoliciesConfig(isrtf=ISRTFParams(window_tokens=10))
    config = harness.make_config("isrtf", max_running=1, policies=params)
    blind = harness.run(config, workload)
    assert blind.by_finish() == [blind.jobs[0].job_id, blind.jobs[1].job_id]
    informed = harness.run(config, workload, predictor=harness.perfect_remaining)
    assert informed.by_finish() == [informed.jobs[1].job_id, informed.jobs[0].job_id]
    assert informed.scheduler.repredictor.jobs > 0
