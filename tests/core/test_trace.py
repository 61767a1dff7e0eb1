"""The core's trace ([scheduler] trace): a line per admission forecast, launch and stop,
holding what bench.forecasterrors replays; nothing without a path."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from daemon.core.events import Capacity, Event, Stopped, Tokens
from daemon.core.job import Job, SamplingSpec, Slo
from daemon.core.lanes import Lane
from daemon.core.scheduler import Scheduler
from daemon.core.settings import SchedulerConfig
from daemon.core.stream import OutputStream
from policies.fcfs import FCFS


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
