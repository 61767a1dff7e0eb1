"""Latency objectives' arithmetic: latest starts, promotion times, list-scheduled starts,
refusals and attainment, in a cost model's seconds."""

from __future__ import annotations

import math

import pytest

from daemon.config import SloConfig
from daemon.core import slo
from daemon.core.costmodel import CostModel
from daemon.core.job import Job, JobStatus, SamplingSpec, Slo
from daemon.core.lanes import Lane
from daemon.core.policy import Policy
from policies.fcfs import FCFS

# 10 ms prefill of any prompt, 10 ms per decode step whatever the batch: easy to add up.
COST = CostModel(prefill_base_s=0.01, prefill_per_token_s=0.0, decode_base_s=0.01,
                 decode_per_seq_s=0.0, decode_per_context_token_s=0.0)


def _policy() -> Policy:
    policy = FCFS()
    policy.cost, policy.batch_hint = COST, 4
    return policy


def _job(ttft_s: float | None = 1.0, tpot_s: float | None = None, tokens: float = 100,
         arrival: float = 0.0, sheddable: bool = False) -> Job:
    return Job("j", [1, 2, 3], SamplingSpec(max_tokens=1000), arrival_time=arrival,
               predicted_output_tokens=tokens, slo=Slo(ttft_s=ttft_s, tpot_s=tpot_s,
                                                       sheddable=sheddable))


def test_latest_start_before_the_first_token_is_the_ttft_deadline_less_prefill() -> None:
    job = _job(ttft_s=1.0, arrival=5.0)
    assert slo.latest_start(job, _policy()) == pytest.approx(5.0 + 1.0 - 0.01)
    promote, latest = slo.times(job, _policy()) or (0, 0)
    assert latest - promote == pytest.approx(slo.PROMOTE_SLACK * 1.0)
    promote, latest = slo.times(job, _policy(), 0.75) or (0, 0)  # [slo] promote_slack
    assert latest - promote == pytest.approx(0.75)
    assert SloConfig().promote_slack == slo.PROMOTE_SLACK  # the config's default is the core's


def test_latest_start_of_a_preempted_job_keeps_its_tpot_budget() -> None:
    job = _job(ttft_s=1.0, tpot_s=0.05, tokens=101)
    job.first_token_time, job.generated_token_ids = 0.5, [7] * 41  # 60 tokens to go
    # 100 gaps of 50 ms from the first token; the rest takes 10 ms prefill + 60 x 10 ms.
    expected = 0.5 + 0.05 * 100 - (0.01 + 60 * 0.01)
    assert slo.latest_start(job, _policy()) == pytest.approx(expected)


def test_no_bound_no_latest_start() -> None:
    assert slo.latest_start(_job(ttft_s=None), _policy()) is None
    best_effort = _job()
    best_effort.slo = None
    assert slo.times(best_effort, _policy()) is None
    assert not _job(ttft_s=None, sheddable=True).on_time  # sheddable, unbounded: not ahead


def test_start_in_list_schedules_the_jobs_ahead_on_the_earliest_free_slot() -> None:
    assert slo.start_in([0.0, 0.0], []) == 0.0
    assert slo.start_in([0.0, 0.5], [1.0]) == 0.5
    assert slo.start_in([0.0, 0.5], [1.0, 1.0]) == 1.0
    assert slo.start_in([], [1.0]) == math.inf


def test_slot_free_times_count_free_slots_and_running_ends() -> None:
    policy = _policy()
    lane = Lane("e0", commands=None, max_running=3)  # type: ignore[arg-type]
    lane.running["a"] = _job(tokens=10)  # 10 steps x 10 ms after no prefill
    left = policy.remaining_tokens
    assert slo.slot_free_times([lane], policy, {"e0": 3}, left) == [0.0, 0.0,
                                                                    pytest.approx(0.1)]
    lane.running["b"] = _job(tokens=50)
    # One slot counted for two running jobs: it frees when the first of them ends.
    assert slo.slot_free_times([lane], policy, {"e0": 1}, left) == [pytest.approx(0.5)]
    lane.failed = True
    assert slo.slot_free_times([lane], policy, {"e0": 3}, left) == []


def test_refusal_names_the_part_and_when_to_retry() -> None:
    policy = _policy()
    assert slo.refusal(_job(ttft_s=1.0), 0.5, policy, 0.01) is None
    late = slo.refusal(_job(ttft_s=1.0), 1.5, policy, 0.01)
    assert late is not None and late.reason == "ttft"
    assert late.predicted_s == pytest.approx(1.51) and late.retry_after_s == pytest.approx(0.51)
    slow = slo.refusal(_job(ttft_s=None, tpot_s=0.005), 0.0, policy, 0.01)
    assert slow is not None and slow.reason == "tpot"
    # how far over the part it breaks: 1.51 s against 1 s; a 10 ms step against 5 ms
    assert late.overshoot(Slo(ttft_s=1.0, tpot_s=0.005)) == pytest.approx(1.51)
    assert slow.overshoot(Slo(ttft_s=1.0, tpot_s=0.005)) == pytest.approx(2.0)


def test_attainment_met_and_missed() -> None:
    job = _job(ttft_s=1.0, tpot_s=0.05)
    job.status, job.first_token_time, job.finish_time = JobStatus.FINISHED, 0.4, 4.4
    job.generated_token_ids = [1] * 101  # 100 gaps over 4 s: 40 ms each
    got = slo.attainment(job)
    assert got is not None and got.met
    assert got.ttft_slack_s == pytest.approx(0.6) and got.tpot_slack_s == pytest.approx(0.01)
    job.first_token_time = 1.2
    got = slo.attainment(job)
    assert got is not None and not got.met and got.ttft_slack_s == pytest.approx(-0.2)
