"""A decision round's choices (daemon/core/decisions.py) on the real core driven by hand:
here, which running job a promoted one that found no room may replace, and when the
engine's spare job yields its place."""

from __future__ import annotations

import msgspec
import pytest

from daemon.core.events import Launch, Stop, Stopped, Tokens
from tests.core.test_admission import Core, job


def commands(c: Core) -> list[str]:
    """Handle the events at hand, run a decision round: its commands, as 'launch j',
    'stop j' or 'offload j' (a stop that saves the job's KV to kvstore first)."""
    while not c.inbox.empty():
        c.core.handle(c.inbox.get_nowait())
    c.core.dispatch()
    out = []
    while not c.commands[0].empty():
        command = c.commands[0].get_nowait()
        assert isinstance(command, Launch | Stop)
        verb = ("launch" if isinstance(command, Launch)
                else "offload" if command.offload else "stop")
        out.append(f"{verb} {command.job_id}")
    return out


@pytest.mark.asyncio
async def test_a_spare_that_has_not_started_yields_its_place_to_a_more_urgent_class() -> None:
    """The job waiting in the engine's queue (scheduler.engine_queue) was the best at its
    hand-off. A later job of the same class waits behind it (the refill is worth one job's
    order); one of a more urgent class takes its place: the spare is stopped before its
    first token and waits again. A spare that has started is not stopped."""
    c = Core(engine_queue=1)
    c.capacity(blocks=10_000, max_num_seqs=1)
    c.submit(job("run", prompt=4, upper=8.0), job("spare", prompt=4, upper=8.0))
    assert commands(c) == ["launch run", "launch spare"]
    c.submit(job("same-class", prompt=4, upper=8.0))
    assert commands(c) == []
    urgent = job("urgent", prompt=4, upper=8.0)
    urgent.priority = -1
    c.submit(urgent)
    assert commands(c) == ["stop spare"]  # nothing cached: nothing to offload
    assert commands(c) == []  # it has not stopped yet: no second spare for the same place
    c.inbox.put_nowait(Stopped("e0", "spare", None))
    assert commands(c) == ["launch urgent"]
    assert {j.job_id for j in c.core.waiting} == {"spare", "same-class"}

    started = Core(engine_queue=1)
    started.capacity(blocks=10_000, max_num_seqs=1)
    started.submit(job("run", prompt=4, upper=8.0), job("spare", prompt=4, upper=8.0))
    assert commands(started) == ["launch run", "launch spare"]
    started.inbox.put_nowait(Tokens("e0", 0.0, [("run", [5]), ("spare", [7])]))  # both began
    second = job("urgent", prompt=4, upper=8.0)
    second.priority = -1
    started.submit(second)
    assert commands(started) == []


@pytest.mark.asyncio
@pytest.mark.parametrize("a_promoted", [True, False])
async def test_a_promoted_job_replaces_only_a_running_job_whose_leaving_lets_it_start(
        a_promoted: bool) -> None:
    """big, promoted, does not fit beside a; backfill starts mid in memory big cannot use
    yet. Stopping mid (more work left than big) would not let big start: the next round's
    backfill would start mid again, and this rule stop it again, round after round with no
    time passing (the simulator livelocked on it). Stopping a, if it may be, does (with
    aging's preemption on: off, the default, big waits for room in any case)."""
    c = Core(aging_preempt=True)
    c.capacity(blocks=20)
    a = job("a", upper=100.0)  # 32 + 100 tokens: 9 blocks; 60 tokens of work
    big = job("big", prompt=100, predicted=10.0, upper=150.0)  # 16 blocks, little work
    mid = job("mid", prompt=4, predicted=30.0, upper=30.0)  # 3 blocks; ends before a
    big.overtake_budget = 0  # promoted: overtaken as often as its budget allows
    if a_promoted:
        a.overtake_budget = 0
    c.submit(a)
    assert commands(c) == ["launch a"]
    c.submit(big, mid)
    if a_promoted:  # a is never preempted; mid's room would not let big start
        assert commands(c) == ["launch mid"]
        assert commands(c) == []
        c.finish("a")
        assert commands(c) == ["launch big"]  # beside mid: the peak fits
    else:
        assert commands(c) == ["launch mid", "stop a"]
        assert commands(c) == []  # a is on its way out
        c.inbox.put_nowait(Stopped("e0", "a", None))  # preempted: back to waiting
        assert commands(c) == ["launch big"]


@pytest.mark.asyncio
@pytest.mark.parametrize(("past_promoted", "first"), [
    ("any", ["launch old", "launch mid"]), ("promoted", ["launch old"]), ("none", [])])
async def test_backfill_past_a_head_aging_promoted(past_promoted: str, first: list[str]
                                                   ) -> None:
    """big, promoted, does not fit beside a. Backfill may start jobs that end before big
    could start in the memory big cannot use yet: by default any (old, promoted too, and
    mid, young); with scheduler.backfill_past_promoted = "promoted" only old; with "none"
    neither. big starts once a has ended."""
    c = Core()
    c.core.config = msgspec.structs.replace(c.core.config, backfill_past_promoted=past_promoted)
    c.capacity(blocks=20)
    big = job("big", prompt=100, predicted=10.0, upper=150.0)  # 16 blocks
    old = job("old", prompt=4, predicted=30.0, upper=30.0)  # 3 blocks; ends before a
    mid = job("mid", prompt=4, predicted=30.0, upper=30.0)
    big.overtake_budget = old.overtake_budget = 0  # promoted: their budgets are spent
    c.submit(job("a", upper=100.0))  # 9 blocks
    assert commands(c) == ["launch a"]
    c.submit(big, old, mid)
    assert commands(c) == first
    c.finish("a")
    assert "launch big" in commands(c)


@pytest.mark.asyncio
async def test_no_backfill_past_a_promoted_head_only_on_the_lane_it_would_start_on_first(
        ) -> None:
    """Two lanes: big, promoted, fits on neither; a (on e0) ends before b (on e1), so big
    would start on e0 first. With backfill_past_promoted = "none", mid does not start on e0
    past big, and still starts on e1, where big would start later."""
    c = Core(lanes=2)
    c.core.config = msgspec.structs.replace(c.core.config, backfill_past_promoted="none")
    c.capacity(blocks=20, lane=0)
    c.capacity(blocks=20, lane=1)
    c.submit(job("a", predicted=40.0, upper=100.0), job("b", predicted=90.0, upper=100.0))
    assert sorted(c.turn(0) + c.turn(1)) == ["a", "b"]
    lane_of_a = 0 if "a" in [j.job_id for j in c.core.lanes[0].running.values()] else 1
    big = job("big", prompt=100, predicted=10.0, upper=150.0)  # 16 blocks: fits beside none
    big.overtake_budget = 0  # promoted
    c.submit(big, job("mid", prompt=4, predicted=20.0, upper=30.0))
    assert c.turn(lane_of_a) == [] and c.turn(1 - lane_of_a) == ["mid"]


@pytest.mark.asyncio
@pytest.mark.parametrize(("past_promoted", "first"), [
    ("any", ["launch sure", "launch unsure"]), ("upper", ["launch sure"])])
async def test_backfill_past_a_promoted_head_at_the_upper_estimate(past_promoted: str,
                                                                   first: list[str]) -> None:
    """big, promoted, does not fit beside a (predicted to end after 60 tokens). sure and
    unsure are both predicted to end after 30 tokens, before big could start; unsure's
    upper estimate is 150 tokens, past it. With backfill_past_promoted = "upper" only sure
    goes first: unsure would delay big if its answer ran long."""
    c = Core()
    c.core.config = msgspec.structs.replace(c.core.config, backfill_past_promoted=past_promoted)
    c.capacity(blocks=22)  # big fits beside sure, not beside unsure too
    big = job("big", prompt=100, predicted=10.0, upper=150.0)  # 16 blocks
    big.overtake_budget = 0  # promoted
    c.submit(job("a", upper=100.0))  # 9 blocks
    assert commands(c) == ["launch a"]
    c.submit(big, job("sure", prompt=4, predicted=30.0, upper=30.0),  # 3 blocks
             job("unsure", prompt=4, predicted=30.0, upper=150.0))  # 10 blocks
    assert commands(c) == first
    for started in ["a", *(launch.split()[1] for launch in first)]:
        c.finish(started)
    assert "launch big" in commands(c)
