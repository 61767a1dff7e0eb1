"""Does the clock the core learns predict the engine's decode steps? `python -m bench.clockcheck
--model DIR` runs the core (fcfs) on one real vLLM engine in this process, serves it traffic
of every shape (batches 1-4, prompts 20-600 tokens), then batches of 1 and 4 whose decode
steps it measures as a client would (each job from its first token to its last), and prints
them beside the clock's prediction.

The suite runs the check on the tiny model (tests/executors/test_vllm_clock.py); this
command runs it on any model, such as the default one, whose steps are several times longer:

    python -m bench.clockcheck --model models/smollm2-135m-instruct --tokens 0.5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from daemon.config import Config, EngineConfig, ModelConfig, SchedulerConfig
from daemon.core.clock import WINDOW
from daemon.core.events import Event
from daemon.core.job import Job, SamplingSpec
from daemon.core.lanes import Lane
from daemon.core.scheduler import Scheduler
from daemon.core.stream import OutputStream
from daemon.executors.vllm import VLLMExecutor
from policies.fcfs import FCFS

MAX_NUM_SEQS = 8
SHAPES = ([40], [600, 20], [300, 80, 150], [20, 500, 60, 250])  # prompt lengths served at once
BATCHES = (1, 4)  # the batches whose decode steps are measured, prompts of 200 tokens
PROMPT = 200


@dataclass
class Served:
    core: Scheduler
    executor: VLLMExecutor
    count: int = 0

    async def run(self, prompts: list[int], output: int, upper: float | None = None,
                  timeout_s: float = 120.0) -> list[Job]:
        """Submit one job per prompt length at once (forced to `output` tokens); wait until
        every one ended."""
        jobs = []
        for prompt in prompts:
            self.count += 1
            jobs.append(Job(
                job_id=f"j{self.count}", arrival_time=self.core.now(),
                prompt_token_ids=[(self.count * 7919 + k) % 30000 + 100 for k in range(prompt)],
                sampling=SamplingSpec(max_tokens=output, temperature=0.0, ignore_eos=True),
                predicted_output_tokens=float(output), predicted_upper_tokens=upper))
            self.core.submit(jobs[-1], OutputStream())
        async with asyncio.timeout(timeout_s):
            while not all(job.is_done for job in jobs):
                await asyncio.sleep(0.01)
        return jobs


@contextlib.asynccontextmanager
async def serve(model: Path, vllm_args: dict[str, object]) -> AsyncIterator[Served]:
    """The core (fcfs, max_running "auto") on one vLLM engine of `model`, for the block."""
    config = Config(model=ModelConfig(path=str(model), max_model_len=2048),
                    engine=EngineConfig(max_num_seqs=MAX_NUM_SEQS, vllm_args=vllm_args))
    inbox: asyncio.Queue[Event] = asyncio.Queue()
    executor = VLLMExecutor("cpu-0", "cpu", config, inbox)
    await executor.start()
    core = Scheduler([Lane(executor.name, executor.commands, MAX_NUM_SEQS)], FCFS(),
                     SchedulerConfig(max_running="auto"), inbox)
    core.accepting = True
    tasks = [asyncio.create_task(core.run()), asyncio.create_task(executor.run())]
    try:
        yield Served(core, executor)
    finally:
        await core.abort_all(10)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await executor.shutdown()


def decode_step_s(jobs: list[Job]) -> float:
    """Seconds per decode step the engine took, measured as a client would: the jobs ran
    together, each from its first token to its last."""
    return sum((job.finish_time or 0.0) - (job.first_token_time or 0.0)
               for job in jobs) / sum(job.num_generated_tokens - 1 for job in jobs)


@dataclass(frozen=True)
class Step:
    batch: int
    measured_s: float
    predicted_s: float
    fits: int  # the clock's refits so far

    def within(self, rel: float) -> bool:
        return abs(self.predicted_s - self.measured_s) <= rel * self.measured_s


async def warm(served: Served, tokens: float = 1.0) -> None:
    """Traffic of every shape for the clock to learn from."""
    for prompts in SHAPES:
        await served.run(prompts, output=round(48 * tokens))


async def measure(served: Served, rel: float = 0.35, tokens: float = 1.0) -> list[Step]:
    """Each batch's decode step against the clock's (after `warm`): one run of the batch,
    measured as a client would, beside the clock's prediction.

    A step missed by more than `rel` is judged again on the same steps on both sides: the
    batch is served until the clock has refitted on a window of it alone (clock.WINDOW
    samples), and the clock's step is set beside the client's measure of the runs in that
    window. On a shared CPU one run (0.5 s) is not the window the clock learned from (5-15
    s): beside a busy neighbour one batch's runs took 16.4, 4.4 and 14.9 ms a step, and in
    CI the clock, which predicts its window's mean, said 7.3 ms beside a run's 5.2 ms."""
    lane = served.core.lanes[0]
    steps = []
    for batch in BATCHES:
        jobs = await served.run([PROMPT] * batch, output=round(96 * tokens))
        step = _judge(lane, batch, jobs, "one run")
        if not step.within(rel):
            step = _judge(lane, batch, await _refit_on(served, batch, tokens),
                          "the runs of the window it refitted on")
        steps.append(step)
    return steps


def _judge(lane: Lane, batch: int, jobs: list[Job], measured_on: str) -> Step:
    step = Step(batch, decode_step_s(jobs),
                lane.clock.decode_step_s(batch, batch * (PROMPT + 48)), lane.clock.fits)
    print(f"decode step at batch {batch}: measured {step.measured_s * 1e3:.2f} ms "
          f"({measured_on}), clock {step.predicted_s * 1e3:.2f} ms ({step.fits} fits)",
          flush=True)
    return step


async def _refit_on(served: Served, batch: int, tokens: float) -> list[Job]:
    """Serve `batch` jobs at a time until the clock has refitted on a window of them only;
    the jobs of the runs whose steps all lie in that window."""
    clock = served.core.lanes[0].clock
    start = clock.samples
    runs: list[tuple[int, int, list[Job]]] = []  # (samples before, after, its jobs)
    for _ in range(64):
        before = clock.samples
        jobs = await served.run([PROMPT] * batch, output=round(96 * tokens))
        runs.append((before, clock.samples, jobs))
        if clock.fitted_at - WINDOW >= start:  # the last fit read this batch's steps only
            end = clock.fitted_at
            return [job for first, last, ran in runs
                    if first >= end - WINDOW and last <= end for job in ran]
    raise RuntimeError("the clock stopped refitting")


async def _main(args: argparse.Namespace) -> int:
    async with serve(args.model, {"dtype": args.dtype}) as served:
        await warm(served, args.tokens)
        steps = await measure(served, args.rel, args.tokens)
        lane = served.core.lanes[0]
        print(f"\n{args.model.name} ({args.dtype}): {lane.clock.fits} fits, "
              f"fit error {lane.clock.fit_error:.3f}")
        print("| batch | measured ms/step | clock ms/step | clock / measured |")
        print("|---|---|---|---|")
        for step in steps:
            print(f"| {step.batch} | {step.measured_s * 1e3:.2f} | {step.predicted_s * 1e3:.2f} "
                  f"| {step.predicted_s / step.measured_s:.2f} |")
        return 0 if all(step.within(args.rel) for step in steps) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.clockcheck", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="a model folder")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--tokens", type=float, default=1.0,
                        help="scale the answers' lengths (0.5 for a slow model)")
    parser.add_argument("--rel", type=float, default=0.35,
                        help="the relative error within which the clock counts as right")
    args = parser.parse_args(argv)
    if not (args.model / "config.json").exists():
        parser.error(f"{args.model} is not a model folder (no config.json)")
    return asyncio.run(_main(args))


if __name__ == "__main__":
    raise SystemExit(main())
