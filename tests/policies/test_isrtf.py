"""ISRTF: re-prediction windows, margin, classes, preemption bound (batching and failures of
the re-predictions themselves: core/test_repredict.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from daemon.config import PoliciesConfig
from daemon.core.job import Job, JobStatus, KVResidency
from policies.isrtf import ISRTF, ISRTFParams, OracleSRPT
from tests.policies import harness
from tests.policies.fakes import job
from tests.policies.harness import Spec


def config(window: int = 10, **kw: float) -> harness.Config:
    params = PoliciesConfig(isrtf=ISRTFParams(window_tokens=window, **kw))  # type: ignore[arg-type]
    return harness.make_config("isrtf", max_running=2, policies=params)


def test_remaining_is_repredicted_every_window_from_partial_output() -> None:
    calls: list[tuple[str, int]] = []

    async def predictor(jobs: Sequence[Job]) -> list[float]:
        calls.extend((j.job_id, j.num_generated_tokens) for j in jobs)
        await asyncio.sleep(0.001)  # takes time, like a model in a thread pool
        return [float(max((j.true_output_tokens or 0) - j.num_generated_tokens, 1))
                for j in jobs]

    result = harness.run(config(window=10), [Spec(0.0, 30, 55, predicted=20.0)],
                         predictor=predictor)
    assert [n for _, n in calls] == [10, 20, 30, 40, 50]
    j = result.jobs[0]
    assert j.status is JobStatus.FINISHED and len(j.generated_token_ids) == 55
    # The last answer (5 left at 50) was set against the count when it was asked.
    assert j.predicted_output_tokens == pytest.approx(55.0, abs=1.0)


def test_victim_choice_margin_and_classes() -> None:
    policy = ISRTF(ISRTFParams(margin=0.5))
    cand = job("c", predicted=100.0)
    long = job("l", predicted=400.0, generated=100, status=JobStatus.RUNNING)  # 300 left
    short = job("s", predicted=140.0, status=JobStatus.RUNNING)
    assert policy.choose_victim(cand, [short, long], 0.0) is long
    assert policy.choose_victim(cand, [short], 0.0) is None  # 140 < 1.5 x 100
    urgent = job("u", predicted=1000.0, priority=0)
    relaxed = job("r", predicted=10.0, priority=1, status=JobStatus.RUNNING)
    assert policy.choose_victim(urgent, [relaxed], 0.0) is relaxed  # class beats length
    assert policy.choose_victim(relaxed, [long], 0.0) is None  # never a more urgent class


def test_oracle_srpt_uses_the_truth_and_needs_no_windows() -> None:
    oracle = OracleSRPT()
    j = job("o", predicted=10.0, true=300, generated=100)
    assert oracle.remaining_tokens(j) == 200.0 and oracle.next_checkpoint(j) is None
    assert ISRTF().next_checkpoint(j) == 150


@pytest.mark.parametrize("bound", [0, 1, 3])
def test_preemptions_per_job_are_bounded(bound: int) -> None:
    """A long job meets a stream of much shorter ones: it is preempted exactly `bound`
    times, then runs to its end however many shorter jobs arrive."""
    params = PoliciesConfig(isrtf=ISRTFParams(max_preemptions=bound))
    workload = [Spec(0.0, 30, 600, predicted=600.0)]
    workload += [Spec(0.3 * (i + 1), 30, 10, predicted=10.0) for i in range(20)]
    result = harness.run(harness.make_config("isrtf", max_running=1, policies=params),
                         workload)
    assert result.jobs[0].num_preemptions == bound
    assert all(j.status is JobStatus.FINISHED for j in result.jobs)


@pytest.mark.parametrize("offload", [False, True])
def test_preempted_jobs_are_offloaded_with_offload_else_kept(offload: bool) -> None:
    """`offload` sends every victim's KV to kvstore (the executor saves it at the abort);
    without it the KV is left in the engine's prefix cache (KEEP)."""
    params = PoliciesConfig(isrtf=ISRTFParams(offload=offload))
    workload = [Spec(0.0, 50, 400, predicted=400.0)] + [
        Spec(0.05 + 0.01 * i, 20, 10, predicted=10.0) for i in range(3)]
    result = harness.run(harness.make_config("isrtf", max_running=1, policies=params),
                         workload)
    preempted = [j for j in result.jobs if j.num_preemptions]
    expected = KVResidency.OFFLOAD if offload else KVResidency.KEEP
    assert preempted and all(j.kv_residency is expected for j in preempted)
