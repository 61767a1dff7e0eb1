"""Job.observed_output_tokens: when a job's end reveals the answer's true length."""

from __future__ import annotations

import pytest

from daemon.core.job import Job, JobStatus, SamplingSpec
from tests.policies import harness
from tests.policies.harness import Spec


def _end(job: Job, status: JobStatus, reason: str | None) -> None:
    """As the core ends a job."""
    job.status, job.finish_time, job.finish_reason = status, 1.0, reason


def _job(generated: int, max_tokens: int, ignore_eos: bool) -> Job:
    job = Job("j", [1, 2, 3], SamplingSpec(max_tokens=max_tokens, ignore_eos=ignore_eos), 0.0)
    job.generated_token_ids = [7] * generated
    return job


@pytest.mark.parametrize(("generated", "max_tokens", "ignore_eos", "status", "reason", "truth"), [
    (40, 100, False, JobStatus.FINISHED, "stop", 40),  # stopped by itself
    (40, 100, True, JobStatus.FINISHED, "stop", 40),  # a stop string ends a forced job too
    (100, 100, True, JobStatus.FINISHED, "length", 100),  # forced length: the budget
    (100, 100, False, JobStatus.FINISHED, "length", None),  # cut: the answer is >= 100
    (30, 100, True, JobStatus.ABORTED, "abort", None),  # client went away
    (30, 100, True, JobStatus.FAILED, None, None),  # engine error
    (30, 100, False, JobStatus.ABORTED, "abort", None),
])
def test_truth_is_known_only_for_natural_stops_and_forced_budgets(
        generated: int, max_tokens: int, ignore_eos: bool, status: JobStatus,
        reason: str | None, truth: int | None) -> None:
    job = _job(generated, max_tokens, ignore_eos)
    assert job.observed_output_tokens is None  # not ended yet
    _end(job, status, reason)
    assert job.observed_output_tokens == truth


def test_a_forced_job_ended_before_its_budget_is_censored() -> None:
    """ignore_eos with budget left and no stop reason: nothing says how long it would be."""
    job = _job(30, 100, True)
    _end(job, JobStatus.FINISHED, "length")
    assert job.observed_output_tokens is None


def test_real_runs_reveal_the_truth_of_natural_and_forced_jobs_only() -> None:
    """Through the core and the simulated engine: natural stops and forced budgets are
    known; a budget cut without ignore_eos and an aborted forced job are not."""
    specs = [Spec(0.0, 10, 20),  # stops by itself at 20
             Spec(0.0, 10, 500, max_tokens=30, ignore_eos=True),  # forced to 30
             Spec(0.0, 10, 500, max_tokens=40, ignore_eos=True),  # forced to 40
             Spec(0.0, 10, 500, max_tokens=25),  # cut at 25: censored
             Spec(0.0, 10, 5000, max_tokens=4000, ignore_eos=True, abort_at_s=0.05)]
    config = harness.make_config("fcfs", max_running=4)
    result = harness.run(config, specs)
    by_id = {job.job_id: job for job in result.jobs}
    assert [by_id[f"j{i:03d}"].observed_output_tokens for i in range(5)] == \
        [20, 30, 40, None, None]
    assert by_id["j003"].finish_reason == "length"
    assert by_id["j004"].status == JobStatus.ABORTED
