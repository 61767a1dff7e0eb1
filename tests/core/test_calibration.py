"""The core learns the served model's scale of predicted lengths from jobs that stopped."""

from __future__ import annotations

import msgspec
import pytest

from daemon.core.calibration import MIN_SAMPLES, LengthCalibration
from daemon.core.job import Job, JobStatus
from tests.policies import harness
from tests.policies.harness import Spec


def _ended(i: int, predicted: float, generated: int, reason: str,
           ignore_eos: bool = False) -> Job:
    job = harness.make_job(i, Spec(0.0, 8, generated, predicted=predicted,
                                   max_tokens=generated if reason == "length" else 4096,
                                   ignore_eos=ignore_eos))
    job.generated_token_ids = [1] * generated
    job.status = JobStatus.ABORTED if reason == "abort" else JobStatus.FINISHED
    job.finish_time, job.finish_reason = 1.0, reason
    return job


def test_scale_is_the_geometric_mean_of_actual_over_first_prediction() -> None:
    cal = LengthCalibration()
    for i in range(MIN_SAMPLES - 1):
        cal.observe(_ended(i, 400.0, 100, "stop"))
    assert cal.scale == 1.0  # not enough evidence yet
    for i in range(200):
        cal.observe(_ended(i, 400.0 if i % 2 else 100.0, 50, "stop"))
    assert cal.scale == pytest.approx((50 / 400 * 50 / 100) ** 0.5, rel=0.1)


def test_budget_cut_and_unpredicted_jobs_teach_nothing() -> None:
    cal = LengthCalibration()
    for i in range(50):
        cal.observe(_ended(i, 400.0, 100, "length"))  # only a lower bound on the truth
        cal.observe(_ended(i, 400.0, 100, "abort"))
        no_prediction = _ended(i, 400.0, 100, "stop")
        no_prediction.predicted_output_tokens = None
        cal.observe(no_prediction)
    assert cal.samples == 0 and cal.scale == 1.0


def test_forced_lengths_teach_the_scale() -> None:
    """ignore_eos + max_tokens (a benchmark replaying a trace): the budget is the truth."""
    cal = LengthCalibration()
    for i in range(MIN_SAMPLES):
        cal.observe(_ended(i, 400.0, 100, "length", ignore_eos=True))
        cal.observe(_ended(i, 400.0, 100, "abort", ignore_eos=True))  # censored still
    assert cal.samples == MIN_SAMPLES
    assert cal.scale == pytest.approx(0.25)


def test_the_first_prediction_counts_not_a_later_revision() -> None:
    cal = LengthCalibration()
    for i in range(MIN_SAMPLES):
        job = _ended(i, 200.0, 100, "stop")
        job.first_prediction = 200.0
        job.predicted_output_tokens = 100.0  # demoted / re-predicted on the way
        cal.observe(job)
    assert cal.scale == pytest.approx(0.5)


@pytest.mark.parametrize("calibrate", [True, False])
def test_scheduler_scales_the_policy_by_what_finished_jobs_showed(calibrate: bool) -> None:
    """Predictions 4x the truth: after the run ssjf's remaining-length estimates (and so its
    service seconds, aging bounds and guard) are on the served scale; off, they stay raw."""
    workload = [Spec(0.05 * i, 20, 10 + i % 7, predicted=4.0 * (10 + i % 7)) for i in range(60)]
    config = harness.make_config("ssjf", max_running=2)
    config = msgspec.structs.replace(config, scheduler=msgspec.structs.replace(
        config.scheduler, calibrate_lengths=calibrate))
    result = harness.run(config, workload)
    assert all(job.finish_reason == "stop" for job in result.jobs)
    policy = result.scheduler.policy
    assert policy.length_scale == pytest.approx(0.25 if calibrate else 1.0, rel=0.05)
    fresh = harness.make_job(99, Spec(0.0, 20, 40, predicted=160.0))
    assert policy.remaining_tokens(fresh) == pytest.approx(160.0 * policy.length_scale)


@pytest.mark.parametrize("ignore_eos", [True, False])
def test_scheduler_calibrates_on_forced_lengths(ignore_eos: bool) -> None:
    """Every job ends by its budget (the sim's natural length is far longer): forced
    (ignore_eos) the budget is the truth and the scale is learned; unforced it is a cut and
    teaches nothing."""
    workload = [Spec(0.05 * i, 20, 1000, predicted=4.0 * (10 + i % 7), max_tokens=10 + i % 7,
                     ignore_eos=ignore_eos) for i in range(60)]
    config = harness.make_config("ssjf", max_running=2)
    result = harness.run(config, workload)
    assert all(job.finish_reason == "length" for job in result.jobs)
    assert result.scheduler.policy.length_scale == pytest.approx(0.25 if ignore_eos else 1.0,
                                                                 rel=0.05)


@pytest.mark.parametrize("trust", [True, False])
def test_a_forced_budget_caps_predictions_only_when_trusted(trust: bool) -> None:
    """Benchmarks that force lengths through max_tokens turn trust_budget off, so ssjf
    orders by its prediction, not by the budget (which would be the truth)."""
    workload = [Spec(0.0, 20, 50, predicted=400.0, max_tokens=50),
                Spec(0.0, 20, 60, predicted=100.0, max_tokens=60)]
    config = harness.make_config("ssjf", max_running=1)
    config = msgspec.structs.replace(config, scheduler=msgspec.structs.replace(
        config.scheduler, trust_budget=trust))
    result = harness.run(config, workload)
    first = result.dispatches[0].job_id
    assert first == ("j000" if trust else "j001")
