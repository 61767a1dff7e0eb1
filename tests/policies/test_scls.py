"""SCLS: slices, local queues planned by DP batching and max-min, memory bound, adaptive
interval (the batching algorithms themselves: test_scls_batching.py)."""

from __future__ import annotations

import math
from collections import Counter, deque

import pytest

from daemon.config import PoliciesConfig, SimConfig
from daemon.core.costmodel import CostModel
from daemon.core.job import JobStatus
from policies.scls import SCLS, SCLSParams
from tests.policies import harness
from tests.policies.fakes import FakeExecutor, context, job
from tests.policies.harness import Spec

COST = CostModel.from_sim(SimConfig())


def serve(size: int, length: int) -> float:
    return COST.batch_serve_s(size, length, 128)


def test_plan_fills_local_queues_by_max_min_and_sets_the_interval() -> None:
    policy = SCLS(SCLSParams(slice_tokens=128, min_interval_s=0.01, interval_factor=0.5),
                  COST, max_running=2)
    waiting = [job(f"w{i}", prompt=p, enqueue=float(i))
               for i, p in enumerate([900, 20, 30, 800, 25, 40])]
    ex0 = FakeExecutor("sim0", max_running=2)
    ex1 = FakeExecutor("sim1", max_running=2)
    ctx = context(policy, waiting, [ex0, ex1], now=5.0)
    first = policy.next_assignment(ctx)
    # Four free slots: the four oldest are planned. DP by input length with pairs:
    # (w1 w2) (w3 w0). Max-min: the longer pair to sim0 (a tie at 0 goes to the first),
    # the shorter to sim1. Each executor launches its jobs in arrival order.
    assert first is not None and (first[0].job_id, first[1].name) == ("w0", "sim0")
    queues = {name: [j.job_id for j, _ in q] for name, q in policy._queues.items()}
    assert queues == {"sim0": ["w3"], "sim1": ["w1", "w2"]}
    long_pair, short_pair = serve(2, 900), serve(2, 30)
    assert policy.interval_s == pytest.approx(max(0.5 * min(long_pair, short_pair), 0.01))
    assert policy.after_round(ctx) == pytest.approx(5.0 + policy.interval_s)


@pytest.mark.parametrize("slice_tokens", [1, 16, 128])
def test_each_dispatch_runs_at_most_one_slice(slice_tokens: int) -> None:
    params = PoliciesConfig(scls=SCLSParams(slice_tokens=slice_tokens, min_interval_s=0.05,
                                            slicing="always"))
    workload = [Spec(0.05 * i, 20 + 10 * i, 7 + 23 * i) for i in range(8)]
    result = harness.run(harness.make_config("scls", max_running=3, policies=params),
                         workload)
    for j in result.jobs:
        assert j.status is JobStatus.FINISHED
        assert j.num_dispatches == math.ceil(len(j.generated_token_ids) / slice_tokens)
    yields = sum(lane.stats.budget_yields for lane in result.scheduler.lanes)
    assert yields == sum(j.num_dispatches - 1 for j in result.jobs)


def test_memory_estimate_caps_concurrency_of_a_batch() -> None:
    """With room for only one (input + slice) at a time, every batch is a single job."""
    params = SCLSParams(slice_tokens=64, kv_capacity_tokens=200)
    policy = SCLS(params, COST, max_running=4)
    assert policy.fits(1, 100) and not policy.fits(2, 100)
    assert policy.fits(3, 2) and not policy.fits(5, 2)


def test_slices_by_default_only_under_a_memory_bound() -> None:
    """"auto": a slice caps each job's KV where a memory bound needs it; without one, a
    continuous-batching engine gains nothing from it (docs/policies.md, Known limits)."""
    a_job = job("j")
    assert SCLS().token_budget(a_job) is None
    assert SCLS(SCLSParams(kv_capacity_tokens=4096)).token_budget(a_job) == 128
    assert SCLS(SCLSParams(slicing="always", slice_tokens=9)).token_budget(a_job) == 9
    assert SCLS(SCLSParams(slicing="never", kv_capacity_tokens=4096)).token_budget(a_job) is None


def test_on_one_executor_by_default_it_serves_in_arrival_order_like_fcfs() -> None:
    """Bursts of mixed prompt lengths: the DP batches by input length, but jobs launch in
    arrival order and whole, so dispatches and completions are FCFS's."""
    workload = [Spec(0.02 * i + (0.5 if i >= 12 else 0.0), 10 + (i * 131) % 900,
                     5 + (i * 53) % 120) for i in range(24)]
    runs = {name: harness.run(harness.make_config(name, max_running=3), workload)
            for name in ("fcfs", "scls")}
    order = {name: [d.job_id for d in r.dispatches] for name, r in runs.items()}
    assert order["scls"] == order["fcfs"] == sorted(order["fcfs"])
    assert runs["scls"].by_finish() == runs["fcfs"].by_finish()


def test_a_free_executor_takes_a_job_planned_for_a_busy_one() -> None:
    """sim1's short job is the lighter load, so max-min plans w0 there; sim1 has no free
    slot, sim0 has one: sim0 takes w0 rather than idle until sim1 frees."""
    policy = SCLS(SCLSParams(min_interval_s=10.0), COST, max_running=2)
    sim0 = FakeExecutor("sim0", max_running=2).admit(job("long", prompt=1000))
    sim1 = FakeExecutor("sim1", max_running=1).admit(job("short", prompt=10))
    ctx = context(policy, [job("w0", prompt=50)], [sim0, sim1], now=0.0)
    pick = policy.next_assignment(ctx)
    assert pick is not None and (pick[0].job_id, pick[1].name) == ("w0", "sim0")
    assert policy._queues["sim1"] == deque()


def test_two_executors_share_the_work() -> None:
    params = PoliciesConfig(scls=SCLSParams(slice_tokens=32, min_interval_s=0.1))
    workload = [Spec(0.01 * i, 10 + (i * 37) % 300, 20 + (i * 53) % 150) for i in range(40)]
    result = harness.run(harness.make_config("scls", max_running=2, policies=params),
                         workload, executors=2)
    per_executor = Counter(d.executor for d in result.dispatches)
    assert set(per_executor) == {"sim0", "sim1"}
    assert min(per_executor.values()) >= 0.3 * sum(per_executor.values())
    assert all(j.status is JobStatus.FINISHED for j in result.jobs)
