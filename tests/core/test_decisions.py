"""A decision round's choices (daemon/core/decisions.py) on the real core driven by hand:
here, which running job a promoted one that found no room may replace."""

from __future__ import annotations

import pytest

from daemon.core.events import Launch, Stop, Stopped
from tests.core.test_admission import Core, job


def commands(c: Core) -> list[str]:
    """Handle the events at hand, run a decision round: its commands, as 'launch j' or
    'stop j'."""
    while not c.inbox.empty():
        c.core.handle(c.inbox.get_nowait())
    c.core.dispatch()
    out = []
    while not c.commands[0].empty():
        command = c.commands[0].get_nowait()
        assert isinstance(command, Launch | Stop)
        out.append(f"{'launch' if isinstance(command, Launch) else 'stop'} {command.job_id}")
    return out


@pytest.mark.asyncio
@pytest.mark.parametrize("a_promoted", [True, False])
async def test_a_promoted_job_replaces_only_a_running_job_whose_leaving_lets_it_start(
        a_promoted: bool) -> None:
    """big, promoted, does not fit beside a; backfill starts mid in memory big cannot use
    yet. Stopping mid (more work left than big) would not let big start: the next round's
    backfill would start mid again, and this rule stop it again, round after round with no
    time passing (the simulator livelocked on it). Stopping a, if it may be, does."""
    c = Core()
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
