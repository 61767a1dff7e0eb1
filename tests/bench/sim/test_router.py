"""EPP-style routing in the simulator: one daemon per executor, placed on arrival."""

from __future__ import annotations

import asyncio

import pytest

from bench.sim import SimOptions, simulate
from bench.sim.overrides import build_config
from bench.sim.predictions import Estimate
from bench.sim.router import make_route, outstanding_tokens, queue_length
from bench.sim.run import NullStream, make_job, start_daemon
from bench.workload import Message, Request
from daemon.executors.virtualclock import VirtualClockLoop
from tests.support import SECONDS_AGING

# Aging in seconds (tests/support.py says why), a promoted job preempting (as a one-slot
# executor needs for its bound to act before the running job ends): routing is what this
# measures.
_CONFIG = build_config(overrides=["scheduler.policy=oracle-sjf", "scheduler.max_running=1",
                                  *SECONDS_AGING, "scheduler.aging.preempt=true"])


def _req(i: int, out: int, at: float = 0.0) -> Request:
    return Request(i, at, [Message("user", "x")], 20, out)


async def _scores() -> list[str]:
    opts = SimOptions(config=_CONFIG)
    daemons = [await start_daemon(opts) for _ in range(2)]
    a, b = (daemon.scheduler for daemon in daemons)
    try:  # no core loop: submitted jobs wait, where the scores see them
        a.submit(make_job(_req(0, 900), Estimate(900.0), opts, 0.0), NullStream())
        for i in (1, 2):
            b.submit(make_job(_req(i, 10), Estimate(10.0), opts, 0.0), NullStream())
        assert (queue_length(a), queue_length(b)) == (1, 2)  # counted from the inbox on
        for sched in (a, b):
            while not sched.inbox.empty():  # what the loop would take in, without launches
                sched.handle(sched.inbox.get_nowait())
        assert (outstanding_tokens(a), outstanding_tokens(b)) == (900.0, 20.0)
        new = make_job(_req(3, 10), Estimate(10.0), opts, 0.0)
        rr = make_route("round_robin", [a, b])
        picks = [make_route(name, [a, b])(new) for name in ("least_queue", "predicted")]
        return [("a" if s is a else "b") for s in [*picks, rr(new), rr(new), rr(new)]]
    finally:
        for daemon in daemons:
            daemon.tasks.append(asyncio.create_task(daemon.scheduler.run()))
            await daemon.stop(abort=True)


def test_scores_read_each_daemons_queue() -> None:
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        assert runner.run(_scores()) == ["a", "b", "a", "b", "a"]
    with pytest.raises(ValueError, match="unknown router"):
        make_route("random", [])


def test_routed_fleet_serves_everything_and_placement_matters() -> None:
    # A long job then shorts, two at a time: counting requests sends shorts behind the long
    # one; predicted outstanding tokens does not.
    reqs = [_req(i, 400 if i % 8 == 0 else 10, at=0.05 * i) for i in range(40)]
    preds = [Estimate(float(r.output_tokens)) for r in reqs]
    mean = {}
    for router in ("least_queue", "predicted", "round_robin"):
        run = simulate(reqs, preds, SimOptions(config=_CONFIG, executors=2, router=router))
        assert [r.ok for r in run.results] == [True] * 40
        assert sum(r.output_tokens for r in run.results) == sum(r.output_tokens for r in reqs)
        mean[router] = sum(r.jct_s for r in run.results) / 40
    assert mean["predicted"] < 0.9 * mean["least_queue"], mean
