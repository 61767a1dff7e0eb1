"""The core's trace ([scheduler] trace): a line per admission forecast, refusal, launch and
stop, holding what bench.forecasterrors replays; nothing without a path."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from daemon.core.events import Capacity, Event, Stopped, Tokens
from daemon.core.job import Job, SamplingSpec, Slo
from daemon.core.lanes import Lane
from daemon.core.ports import SloUnreachable
from daemon.core.scheduler import Scheduler
from daemon.core.settings import SchedulerConfig
from daemon.core.stream import OutputStream
from policies.fcfs import FCFS
from tests.core.test_forecast import frozen_core, new_job
from tests.support import learn_forecast_errors


def _job(job_id: str, ttft_s: float | None = None) -> Job:
    now = asyncio.get_running_loop().time()
    return Job(job_id=job_id, prompt_token_ids=[1, 2], arrival_time=now,
               sampling=SamplingSpec(max_tokens=3, ignore_eos=True),
               predicted_output_tokens=3.0, slo=None if ttft_s is None else Slo(ttft_s=ttft_s))


@pytest.mark.asyncio
async def test_a_line_per_forecast_launch_and_stop_and_none_when_off(tmp_path: Path) -> None:
    path = tmp_path / "core.trace.jsonl"
    inbox: asyncio.Queue[Event] = asyncio.Queue()
    config = SchedulerConfig(max_running=1, trace=str(path))
    core = Scheduler([Lane("e0", asyncio.Queue(), 1)], FCFS(), config, inbox)  # type: ignore[arg-type]
    core.lanes[0].set_capacity(Capacity("e0", kv_blocks=10, block_size=16, max_num_seqs=8),
                               1)
    core.accepting = True

    def step() -> None:
        while not inbox.empty():
            core.handle(inbox.get_nowait())
        core.dispatch()

    core.submit(_job("a"), OutputStream())  # no objective: no forecast
    step()
    for job in (_job("b", 30.0), _job("c", 30.0)):  # both wait behind "a"
        core.submit(job, OutputStream())
    step()
    inbox.put_nowait(Tokens("e0", core.now(), [("a", [7, 8, 9])]))
    inbox.put_nowait(Stopped("e0", "a", "length"))
    step()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["ev"], r["id"]) for r in lines] == [
        ("launch", "a"), ("admit", "b"), ("admit", "c"), ("stop", "a"), ("launch", "b")]
    c = lines[2]
    assert [entry[0] for entry in c["ahead"]] == ["b"]  # what the forecast put before it
    assert c["queue_s"] > 0 and c["refused"] is None and c["latest"] is not None
    (lane,) = c["lanes"]
    assert lane["kv_blocks"] == 10 and lane["block"] == 16 and list(lane["running"]) == ["a"]
    assert [job_id for _, job_id in lane["ends"]] == ["a"]
    assert lane["running"]["a"] == [2, 0, 3.0, 3.0]  # context, made, predicted, left
    stop = lines[3]
    assert stop["ended"] and stop["generated"] == 3 and stop["predicted"] == 3.0
    # a reload without a path closes it: nothing more is written
    core.reconfigure(SchedulerConfig(max_running=1), FCFS())
    step()
    core.submit(_job("d", 30.0), OutputStream())
    step()
    assert len(path.read_text().splitlines()) == len(lines)
    assert not core.forecast.trace.on
    # a path it cannot write leaves the trace off, and the core serving
    core.reconfigure(SchedulerConfig(max_running=1, trace=str(tmp_path / "no" / "such")),
                     FCFS())
    step()
    assert not core.forecast.trace.on


@pytest.mark.asyncio
async def test_a_refusal_on_a_forecast_writes_how_far_over_it_was(tmp_path: Path) -> None:
    """Refusals made by the HTTP layer's probe (before the prompt is tokenized, where most
    are) and at admission each write a line with the overshoot they were refused on and the
    late jobs the overload gate counted."""
    path = tmp_path / "core.trace.jsonl"
    core = frozen_core()
    forecast, now = core.forecast, core.now()
    forecast.trace.open(str(path))
    core.lanes[0].running["r"] = new_job("r", 100, now)  # a forecast wait of 1 s
    learn_forecast_errors(forecast)
    assert forecast.refusal(new_job("n", 5, now, slo=Slo(ttft_s=0.5))) is not None
    forecast.overload.turned_late(now)  # a waiting job passed its latest start
    with pytest.raises(SloUnreachable):
        forecast.admit(new_job("m", 5, now, slo=Slo(ttft_s=0.25)), [], 0, 10, set())
    assert forecast.refusal(new_job("k", 5, now, slo=Slo(ttft_s=2.0))) is None  # no line
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    refusals = [(r["id"], r["probe"], r["cause"], round(r["overshoot"], 1), r["late"],
                 r["inflow"]) for r in lines if r["ev"] == "refuse"]
    assert refusals == [("n", True, "ttft:queue", 2.0, 0, 1.0),  # arrivals / ends: 1 / 0
                        ("m", False, "ttft:queue", 4.0, 1, 2.0)]
    assert [r["ev"] for r in lines] == ["refuse", "admit", "refuse"]
    forecast.trace.close()
