"""Plays the core for one executor in executor tests: Launch / Stop commands into its queue,
its events applied to plain Jobs (tokens, resumes) the way the core applies them, and each
dispatch's Stopped report handed to the test."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from daemon.config import Config, EngineConfig, ModelConfig
from daemon.core.events import Event, Launch, Started, Stop, Stopped, Tokens
from daemon.core.job import Job, StopRequest
from daemon.core.stream import OutputStream
from daemon.executors.base import Executor
from tests.support import read_to_end


class Driver:
    def __init__(self, executor: Executor, inbox: asyncio.Queue[Event]) -> None:
        self.executor = executor
        self.inbox = inbox
        self.streams: dict[str, OutputStream] = {}
        self.started: list[Started] = []  # every dispatch's first output
        self.stops: asyncio.Queue[Stopped] = asyncio.Queue()
        self._jobs: dict[str, Job] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self.executor.run()),
                       asyncio.create_task(self._pump())]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def launch(self, job: Job, budget: int | None = None, offloaded: bool = False) -> None:
        job.num_dispatches += 1
        job.tokens_at_dispatch = job.num_generated_tokens
        stream = self.streams.setdefault(
            job.job_id, OutputStream(job.sampling.stop, job.sampling.min_tokens))
        self._jobs[job.job_id] = job
        left = job.num_remaining_budget_tokens
        self.executor.commands.put_nowait(Launch(
            job_id=job.job_id, dispatch=job.num_dispatches,
            prompt_token_ids=job.prompt_token_ids,
            generated_token_ids=list(job.generated_token_ids), sampling=job.sampling,
            max_new_tokens=left if budget is None else min(left, budget), engine_priority=0,
            stream=stream, resume_offloaded=offloaded))

    def stop(self, job: Job, why: StopRequest, offload: bool = False) -> None:
        self.executor.commands.put_nowait(Stop(job.job_id, why, offload))

    async def next_stop(self, timeout_s: float = 60.0) -> Stopped:
        """The next dispatch's end; a job that ended for good gets its stream ended."""
        stopped = await asyncio.wait_for(self.stops.get(), timeout_s)
        job = self._jobs[stopped.job_id]
        job.kv_offloaded = stopped.kv_offloaded
        if stopped.finish_reason == "stop" or job.num_remaining_budget_tokens <= 0:
            self.streams[job.job_id].finish(stopped.finish_reason or "length")
        return stopped

    async def run(self, job: Job, budget: int | None = None) -> Stopped:
        self.launch(job, budget)
        return await self.next_stop()

    async def wait_tokens(self, job: Job, count: int) -> None:
        while job.num_generated_tokens < count:
            await asyncio.sleep(0.002)

    async def text(self, job: Job) -> str:
        """The whole text of an ended job, as its client reads it."""
        deltas, _ = await read_to_end(self.streams[job.job_id], 5)
        return "".join(delta.text for delta in deltas)

    def resumes(self, job: Job) -> list[tuple[int, int]]:
        """(context tokens, recomputed tokens) of each of the job's dispatches after its
        first (a resume's context holds the tokens generated before it)."""
        return [(s.context_tokens, max(s.context_tokens - s.cached_tokens, 0))
                for s in self.started if s.job_id == job.job_id][1:]

    async def _pump(self) -> None:
        while True:
            event = await self.inbox.get()
            if isinstance(event, Tokens):
                for job_id, ids in event.items:
                    self._jobs[job_id].generated_token_ids.extend(ids)
            elif isinstance(event, Started):
                self.started.append(event)
            elif isinstance(event, Stopped):
                self.stops.put_nowait(event)


@contextlib.asynccontextmanager
async def float32_engine(model: Path) -> AsyncIterator[Driver]:
    """A real vLLM executor on `model`, driven. float32: a resumed job's tokens are
    re-prefilled, and bf16's prefill and decode kernels round differently, so a near-tie in
    greedy argmax could flip (see docs)."""
    from daemon.executors.vllm import VLLMExecutor  # imports vLLM: only engine tests pay

    config = Config(model=ModelConfig(path=str(model), max_model_len=1024),
                    engine=EngineConfig(max_num_seqs=4, vllm_args={"dtype": "float32"}))
    inbox: asyncio.Queue[Event] = asyncio.Queue()
    executor = VLLMExecutor("cpu-0", "cpu", config, inbox)
    await executor.start()
    driver = Driver(executor, inbox)
    driver.start()
    try:
        yield driver
    finally:
        await driver.close()
        await executor.shutdown()
