"""ALISE: execution-time estimates, virtual aging, demote-and-double, EWT and KV residency
in the policy (the EWT and residency rules themselves: test_alise_wait.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from daemon.config import PoliciesConfig, SimConfig
from daemon.core.costmodel import CostModel
from daemon.core.job import Job, JobStatus, KVResidency
from daemon.core.policy import Checkpoint
from policies.alise import ALISE, ALISEParams
from tests.policies import harness
from tests.policies.fakes import FakeExecutor, context, job
from tests.policies.harness import Spec

COST = CostModel.from_sim(SimConfig())


def test_remaining_time_is_prefill_plus_decode() -> None:
    policy = ALISE(ALISEParams(), COST, max_running=4)
    waiting = job("w", prompt=500, predicted=100.0)
    running = job("r", prompt=500, predicted=100.0, status=JobStatus.RUNNING)
    decode = COST.decode_share_s(500, 100, 4)
    assert policy.remaining_s(running) == pytest.approx(decode)
    assert policy.remaining_s(waiting) == pytest.approx(COST.prefill_s(500) + decode)
    resumed = job("p", prompt=500, predicted=100.0, generated=60)  # re-prefill 560 tokens
    assert policy.remaining_s(resumed) == pytest.approx(
        COST.prefill_s(560) + COST.decode_share_s(560, 40, 4))
    assert policy.remaining_s(job("s", predicted=10.0)) < policy.remaining_s(
        job("l", predicted=1000.0))


def test_virtual_aging_key_halves_time_per_threshold() -> None:
    """A job that waited two thresholds longer ranks as if its time were a quarter: the
    static heap key gives the same order as aged levels would at any later instant."""
    policy = ALISE(ALISEParams(age_threshold_s=10.0), COST)
    fresh = job("a", predicted=50.0, enqueue=100.0)
    old = job("b", predicted=400.0, enqueue=80.0)
    t_fresh, t_old = policy.remaining_s(fresh), policy.remaining_s(old)
    assert policy.order_key(old) - policy.order_key(fresh) == pytest.approx(
        math.log2(t_old / t_fresh) - 2.0)
    for now in (100.0, 137.0):
        assert policy.aged_s(old, now) == pytest.approx(t_old * 2 ** (-(now - 80.0) / 10.0))
        aged_order = policy.aged_s(old, now) < policy.aged_s(fresh, now)
        assert aged_order == (policy.order_key(old) < policy.order_key(fresh))


def test_outliving_the_prediction_demotes_and_doubles() -> None:
    workload = [Spec(0.0, 40, 35, predicted=10.0)]
    result = harness.run(harness.make_config("alise", max_running=1), workload)
    assert result.jobs[0].predicted_output_tokens == 40.0  # 10 -> 20 -> 40
    policy = ALISE(ALISEParams(demote_factor=3.0), COST)
    running = job("r", predicted=10.0, generated=11, status=JobStatus.RUNNING)
    assert policy.next_checkpoint(job("f", predicted=10.0)) == 11
    # Asks for a re-prediction (without a predictor, a no-op) and demotes: 10 -> 30; the
    # core applies it, the policy does not write the job.
    assert policy.on_checkpoint(running, 0.0) == Checkpoint(True, 30.0)
    assert running.predicted_output_tokens == 10.0
    assert result.scheduler.repredictor.batches == 0


def test_repredicts_every_window_and_the_answer_replaces_doubling() -> None:
    policy = ALISE(ALISEParams(), COST)
    assert policy.next_checkpoint(job("a", predicted=500.0, generated=60)) == 100
    asked: list[int] = []

    async def predictor(jobs: Sequence[Job]) -> list[float]:
        asked.extend(j.num_generated_tokens for j in jobs)
        return await harness.perfect_remaining(jobs)

    # Predicted 10, true 130: at 11 a demotion to 20 and a re-prediction that says 130;
    # the demotion mark 21 was set before that answer came (no demotion there, one more
    # re-prediction); then the windows 50 and 100. Doubling alone would end at 160.
    result = harness.run(harness.make_config("alise", max_running=1),
                         [Spec(0.0, 40, 130, predicted=10.0)], predictor=predictor)
    assert asked == [11, 21, 50, 100]
    assert result.jobs[0].predicted_output_tokens == pytest.approx(130.0)
    assert result.jobs[0].status is JobStatus.FINISHED


def test_preemption_counts_the_victims_resume_cost() -> None:
    policy = ALISE(ALISEParams(margin=0.0), COST)
    candidate = job("c", prompt=10, predicted=120.0)
    victim = job("v", prompt=10, predicted=500.0, generated=100, status=JobStatus.RUNNING)
    assert policy.choose_victim(candidate, [victim], now=0.0) is victim
    # 30k tokens of context: re-prefilling them eats most of what preempting would save.
    heavy = job("h", prompt=30_000, predicted=200.0, generated=100, status=JobStatus.RUNNING)
    assert policy.remaining_s(heavy) > policy.remaining_s(candidate)
    assert policy.choose_victim(candidate, [heavy], now=0.0) is None


def test_offloaded_kv_makes_resume_and_preemption_cheap() -> None:
    """A job whose KV was offloaded to kvstore resumes by reloading it: one token computed,
    not its context. With `offload` on, a victim's resume is charged as such a reload, so
    a long-context job that drop must not preempt (its re-prefill eats the gain) is one."""
    policy = ALISE(ALISEParams(margin=0.0), COST, max_running=4)
    dropped = job("d", prompt=2000, predicted=100.0, generated=60)
    offloaded = job("o", prompt=2000, predicted=100.0, generated=60)
    offloaded.kv_offloaded = True
    decode = COST.decode_share_s(2060, 40, 4)
    assert policy.remaining_s(dropped) == pytest.approx(COST.prefill_s(2060) + decode)
    assert policy.remaining_s(offloaded) == pytest.approx(COST.prefill_s(1) + decode)
    candidate = job("c", prompt=10, predicted=120.0)
    heavy = job("h", prompt=30_000, predicted=200.0, generated=100, status=JobStatus.RUNNING)
    assert policy.choose_victim(candidate, [heavy], now=0.0) is None
    swapping = ALISE(ALISEParams(margin=0.0, offload=True), COST, max_running=4)
    assert swapping.choose_victim(candidate, [heavy], now=0.0) is heavy


def test_review_sets_ewt_and_residency_and_placement_follows_kept_kv() -> None:
    policy = ALISE(ALISEParams(max_resident_jobs=1), COST)
    preempted = [job(f"p{i}", predicted=80.0 + i, generated=20, executor="sim1", dispatches=1)
                 for i in range(2)]
    fresh = job("f", predicted=30.0)
    ex0 = FakeExecutor("sim0", max_running=1).admit(job("r", predicted=500.0))
    ex1 = FakeExecutor("sim1", max_running=1)
    ctx = context(policy, [*preempted, fresh], [ex0, ex1], now=1.0, promote_after_s=60.0)
    assert policy.after_round(ctx) == pytest.approx(1.0 + ALISEParams().review_interval_s)
    assert all(j.estimated_wait_s is not None for j in preempted)
    assert [j.kv_residency for j in preempted] == [KVResidency.KEEP, KVResidency.DROP]
    assert fresh.kv_residency is None and fresh.estimated_wait_s is None  # holds no KV
    assert policy.choose_executor(preempted[0], [ex0, ex1]) is ex1
    ex1.admit(job("busy", predicted=900.0))
    ex0.running.clear()
    assert policy.choose_executor(fresh, [ex0, ex1]) is ex0  # least estimated time


def test_alise_runs_in_the_sim_with_residency_advice() -> None:
    params = PoliciesConfig(alise=ALISEParams(max_resident_jobs=1, review_interval_s=0.05))
    workload = [Spec(0.02 * i, 50, 40 + 60 * (i % 5), predicted=40.0 + 60 * (i % 5))
                for i in range(30)]
    result = harness.run(harness.make_config("alise", max_running=2, policies=params),
                         workload, executors=2)
    assert all(j.status is JobStatus.FINISHED for j in result.jobs)
    assert sum(j.num_preemptions for j in result.jobs) > 0
    assert any(j.kv_residency is not None for j in result.jobs)
    assert not any(math.isnan(j.estimated_wait_s or 0.0) for j in result.jobs)


@pytest.mark.parametrize(("offload", "spill"), [(True, KVResidency.OFFLOAD),
                                                 (False, KVResidency.DROP)])
def test_preemption_keeps_kv_up_to_the_limit_then_offloads_or_drops(
        offload: bool, spill: KVResidency) -> None:
    policy = ALISE(ALISEParams(max_resident_jobs=1, offload=offload), COST)
    victim = job("v", predicted=900.0, generated=30, status=JobStatus.RUNNING)
    ex0 = FakeExecutor("sim0", max_running=1).admit(victim)
    held_elsewhere = job("h1", generated=5, executor="sim1", dispatches=1)
    held_elsewhere.kv_residency = KVResidency.KEEP
    ctx = context(policy, [held_elsewhere], [ex0, FakeExecutor("sim1")])
    assert policy.preempt_residency(victim, ctx) is KVResidency.KEEP  # sim0 keeps none yet
    held_here = job("h0", generated=5, executor="sim0", dispatches=1)
    held_here.kv_residency = KVResidency.KEEP
    ctx = context(policy, [held_elsewhere, held_here], [ex0, FakeExecutor("sim1")])
    assert policy.preempt_residency(victim, ctx) is spill
    # Offloaded KV lives in that executor's kvstore: the resume goes back there if free.
    victim.kv_residency, victim.status = spill, JobStatus.WAITING
    ex0.running.clear()
    ex1 = FakeExecutor("sim1", max_running=1)
    chosen = policy.choose_executor(victim, [ex1, ex0])
    assert chosen is (ex0 if spill is KVResidency.OFFLOAD else ex1)


def test_preempted_jobs_carry_the_policys_residency_in_the_sim() -> None:
    params = PoliciesConfig(alise=ALISEParams(max_resident_jobs=0, offload=True))
    workload = [Spec(0.0, 50, 400, predicted=400.0)] + [
        Spec(0.05 + 0.01 * i, 20, 10, predicted=10.0) for i in range(3)]
    result = harness.run(harness.make_config("alise", max_running=1, policies=params),
                         workload)
    preempted = [j for j in result.jobs if j.num_preemptions]
    assert preempted and all(j.kv_residency is KVResidency.OFFLOAD for j in preempted)
