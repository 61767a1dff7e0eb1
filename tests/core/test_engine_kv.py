"""What the core tells vLLM and what it hears back: admission on the engine's own report of
its KV (scheduler.engine_kv) and the priority each Launch carries (scheduler.engine_order).
The real core and lanes driven by hand, as in test_admission."""

from __future__ import annotations

import asyncio

import pytest

from daemon.core.events import Capacity
from daemon.core.lanes import Lane
from policies.ssjf import SSJF
from tests.core.test_admission import Core, job


def test_the_engines_report_frees_what_the_ledger_still_counts_unless_a_preempted_job_waits(
        ) -> None:
    """scheduler.engine_kv: the KV held now is the engine's own count (its last step's
    blocks in use), plus the jobs handed to it since and the next tokens of the others,
    where that is below the ledger's; the ledger's while the engine's queue holds more than
    the jobs just handed to it (one it preempted waits there for its blocks)."""
    lane = Lane("e0", asyncio.Queue(), 8)
    lane.set_capacity(Capacity("e0", 20, 16, 8), None)
    lane.engine_kv = True
    for i in range(4):  # 64-token contexts: 4 blocks each, 5 with their next tokens
        lane.admit(job(f"r{i}", prompt=64), 100.0)
        lane.started(lane.running[f"r{i}"], 64, 0)
    assert lane.held_now_blocks() == 20 and lane.free_slots == 0  # no report yet: the ledger
    lane.report(kv_usage=0.6, engine_waiting=0)  # the engine holds 12 of 20
    assert lane.held_now_blocks() == 12 + 4  # + one block of next tokens each
    assert lane.free_slots > 0 and lane.room_now(48) and not lane.room_now(100)
    lane.admit(job("new", prompt=48), 60.0)  # handed over, its first output not back yet
    assert lane.held_now_blocks() == 16 + 4  # counted whole until the engine's report has it
    lane.started(lane.running["new"], 48, 0)
    lane.report(kv_usage=0.75, engine_waiting=0)
    assert lane.held_now_blocks() == 15 + 4 + 1
    lane.report(kv_usage=0.45, engine_waiting=1)  # it preempted one of ours: that room is its
    assert lane.held_now_blocks() == lane.kv.now_blocks() == 24 and not lane.room_now(16)
    lane.engine_kv = False
    lane.report(kv_usage=0.1, engine_waiting=0)
    assert lane.held_now_blocks() == 24


@pytest.mark.asyncio
async def test_engine_order_hands_vllm_the_policys_priority_or_the_arrival_order() -> None:
    """scheduler.engine_order: vLLM preempts the job it ranks last. "launch" (the default)
    ranks by class only, so vLLM's tie-break, its own request's arrival (the launch),
    decides as its FCFS does; "policy" by the policy's engine priority (ssjf: most predicted
    tokens left last); "arrival" by class, then arrival (the latest arrival last)."""
    def priorities(order: str) -> dict[str, int]:
        """The engine priority each job's Launch carries."""
        c = Core(max_running=4, engine_order=order, policy=SSJF())
        early_long, late_short = job("early-long", predicted=900.0), job("late-short")
        late_short.arrival_time = 5.0
        c.submit(early_long, late_short)
        while not c.inbox.empty():
            c.core.handle(c.inbox.get_nowait())
        c.core.dispatch()
        launches = [c.commands[0].get_nowait() for _ in range(c.commands[0].qsize())]
        return {launch.job_id: launch.engine_priority for launch in launches}

    by_policy, by_arrival = priorities("policy"), priorities("arrival")
    assert by_policy["early-long"] > by_policy["late-short"]  # the long one is the victim
    assert by_arrival["early-long"] < by_arrival["late-short"]  # the latest arrival is the victim
    by_launch = priorities("launch")
    assert by_launch["early-long"] == by_launch["late-short"]  # vLLM: the one added last
