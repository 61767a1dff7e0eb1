"""The daemon's own clock (daemon/core/clock.py): the real core driven by hand, an engine
played by the test with known synthetic step times (events in, commands out); then the fit
alone, on what real traffic does to it (outliers, a batch that never varies)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pytest

from daemon.config import AgingConfig, SchedulerConfig
from daemon.core import clock as clockmod
from daemon.core.clock import StepClock
from daemon.core.costmodel import CostModel
from daemon.core.events import Event, Launch, Predicted, Started, Stopped, Tokens
from daemon.core.job import Job, SamplingSpec
from daemon.core.lanes import Lane
from daemon.core.scheduler import Scheduler
from daemon.core.stream import OutputStream
from policies.fcfs import FCFS
from policies.ssjf import SSJF
from tests.core.fakes import AskedPredictor

# A small GPU-like engine (0.5 ms decode steps) behind a prior that thinks 8 ms (the
# generic cost model): every estimate is ~10x off until the clock learns.
TRUTH = CostModel(prefill_base_s=0.0004, prefill_per_token_s=2e-6, decode_base_s=0.0005,
                  decode_per_seq_s=4e-5, decode_per_context_token_s=3e-8)


@dataclass
class Engine:
    """Plays one executor for the core: takes its Launch commands, runs continuous-batching
    steps timed by `truth`, and reports Started, one Tokens per step and Stopped."""

    core: Scheduler
    inbox: asyncio.Queue[Event]
    commands: asyncio.Queue[object]
    truth: CostModel
    now: float = 0.0
    steps: int = 0
    running: dict[str, list[int]] = field(default_factory=dict)  # job -> [context, left]
    new: set[str] = field(default_factory=set)

    def turn(self) -> None:
        """What one turn of the core's loop does: every event at hand, a decision round."""
        while not self.inbox.empty():
            self.core.handle(self.inbox.get_nowait())
        self.core.dispatch()
        while not self.commands.empty():
            launch = self.commands.get_nowait()
            assert isinstance(launch, Launch)
            context = len(launch.prompt_token_ids) + len(launch.generated_token_ids)
            self.running[launch.job_id] = [context, launch.max_new_tokens]
            self.new.add(launch.job_id)

    def step(self) -> None:
        prefill = sum(self.running[j][0] for j in self.new)
        context = sum(ctx for ctx, _ in self.running.values())
        self.now += self.truth.step_s(prefill, len(self.running), context)
        for job_id in sorted(self.new):
            self.inbox.put_nowait(Started("e0", job_id, self.running[job_id][0], 0))
        self.new.clear()
        self.inbox.put_nowait(Tokens("e0", self.now, [(j, [7]) for j in self.running]))
        for job_id, state in list(self.running.items()):
            state[0] += 1
            state[1] -= 1
            if state[1] == 0:
                del self.running[job_id]
                self.inbox.put_nowait(Stopped("e0", job_id, "length"))
        self.steps += 1
        self.turn()

    def serve(self, jobs: list[Job]) -> None:
        """Submit the jobs and step until every one ended."""
        for job in jobs:
            self.core.submit(job, OutputStream())
        self.turn()
        while self.running:
            self.step()


def _core(policy: object = None, max_running: int = 8,
          aging: AgingConfig | None = None, fits: Executor | None = None) -> Engine:
    inbox: asyncio.Queue[Event] = asyncio.Queue()
    commands: asyncio.Queue[object] = asyncio.Queue()
    core = Scheduler([Lane("e0", commands, max_running)], policy or FCFS(),  # type: ignore[arg-type]
                     SchedulerConfig(max_running=max_running, aging=aging or AgingConfig()),
                     inbox, fits=fits)
    core.accepting = True
    return Engine(core, inbox, commands, TRUTH)


def _jobs(prefix: str, count: int, rng: np.random.Generator) -> list[Job]:
    return [Job(job_id=f"{prefix}{i}", prompt_token_ids=[1] * int(rng.integers(10, 400)),
                sampling=SamplingSpec(max_tokens=int(rng.integers(5, 60)), ignore_eos=True),
                arrival_time=0.0, predicted_output_tokens=30.0) for i in range(count)]


@pytest.mark.asyncio
async def test_the_clock_converges_to_the_engines_step_times_and_ignores_idle_gaps() -> None:
    engine = _core()
    lane, rng = engine.core.lanes[0], np.random.default_rng(0)
    assert engine.core.policy.cost == CostModel()  # the configured prior until steps come
    busy_periods = 0
    for burst in range(6):  # bursts of 12 jobs with 30 s of idle engine between them
        engine.serve(_jobs(f"b{burst}-", 12, rng))
        busy_periods += 1
        engine.now += 30.0  # idle: nothing runs; the next burst's first step is no sample
    # Every interval between two steps that shared a job is a sample; the first step of
    # each busy period (after 30 s of idle) is not.
    assert lane.clock.samples == engine.steps - busy_periods
    learned = lane.clock.cost
    for batch, context in ((1, 200), (4, 1000), (8, 3000)):
        want = TRUTH.step_s(0, batch, context)
        assert lane.clock.decode_step_s(batch, context) == pytest.approx(want, rel=0.03)
    assert learned.prefill_s(500) == pytest.approx(TRUTH.prefill_s(500), rel=0.15)
    assert lane.clock.fit_error < 0.01  # noiseless steps: the model is the engine's
    # Every estimate reads it: the policy's cost model is the learned one.
    assert engine.core.policy.cost == learned


@pytest.mark.asyncio
async def test_aging_bounds_follow_the_learned_clock() -> None:
    """ssjf's waiting jobs' deadlines (aging in seconds, not overtaking) are re-keyed once
    the clock learned that steps are ~16x faster than the prior said: a bound set in prior
    seconds would be 16x too loose."""
    engine = _core(SSJF(), max_running=2, aging=AgingConfig(overtaking=False))
    rng = np.random.default_rng(1)
    engine.core.submit(Job(job_id="first", prompt_token_ids=[1] * 50, arrival_time=0.0,
                           sampling=SamplingSpec(max_tokens=400, ignore_eos=True),
                           predicted_output_tokens=400.0), OutputStream())
    engine.turn()
    waiting = _jobs("w", 6, rng)
    for job in waiting:
        engine.core.submit(job, OutputStream())
    engine.turn()
    queue = engine.core.waiting
    bounds = {job.job_id: queue.deadline(job) - queue.wait_started(job) for job in queue}
    while engine.core.lanes[0].clock.fits < 3:
        engine.step()
    still = [job for job in queue if job.job_id in bounds]
    assert still, "some of the first waiting jobs are still waiting"
    for job in still:
        assert queue.deadline(job) - queue.wait_started(job) < bounds[job.job_id] / 8
    # The deadline heap itself was re-keyed: the next promotion is due that much sooner.
    due = queue.promotion_due()
    assert due is not None
    start = min(queue.wait_started(job) for job in still)
    assert due - start < min(bounds.values()) / 8


@pytest.mark.asyncio
async def test_in_the_worker_the_loop_goes_on_while_a_fit_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon's core fits in a worker thread: while a fit is held there the core keeps
    handling steps (no second fit is started for the lane), and the fit comes back as an
    event the clock adopts, the same model as fitting that window inline."""
    release, taken, fit = threading.Event(), [], clockmod.fit

    def held_fit(window: clockmod.Window) -> clockmod.Fit:
        taken.append(window)
        assert release.wait(10.0)
        return fit(window)

    monkeypatch.setattr(clockmod, "fit", held_fit)
    with ThreadPoolExecutor(max_workers=1) as worker:
        engine = _core(fits=worker)
        lane = engine.core.lanes[0]
        for i in range(4):  # 300 steps of work
            engine.core.submit(Job(job_id=f"a{i}", prompt_token_ids=[1] * 50,
                                   sampling=SamplingSpec(max_tokens=300, ignore_eos=True),
                                   arrival_time=0.0, predicted_output_tokens=300.0),
                               OutputStream())
        engine.turn()
        while lane.clock.samples < clockmod.MIN_SAMPLES * 4:  # past three due fits
            engine.step()
        assert len(taken) == 1 and lane.clock.fits == 0  # one in the worker, none adopted
        assert lane.clock.cost == CostModel()  # the prior meanwhile
        release.set()
        await _until(lambda: lane.clock.fits > 0, engine)  # its Refitted event came
        assert lane.clock.fits == 1 and lane.clock.fitted_at == clockmod.MIN_SAMPLES
        assert lane.clock.cost == fit(taken[0]).cost
        assert engine.core.policy.cost == lane.clock.cost  # the estimates moved with it
        while lane.clock.samples < clockmod.MIN_SAMPLES * 8:  # the next due fit: 64
            engine.step()
        await _until(lambda: lane.clock.fits > 1, engine)
        assert [window.samples for window in taken] == [clockmod.MIN_SAMPLES, 64]


async def _until(done: Callable[[], bool], engine: Engine) -> None:
    for _ in range(500):
        if done():
            return
        await asyncio.sleep(0.01)
        engine.turn()
    raise AssertionError("not within 5 s")


def test_a_fit_of_a_window_older_than_the_prior_is_not_adopted() -> None:
    clock = StepClock(CostModel())
    _feed(clock, TRUTH, np.random.default_rng(2), 40)
    late = clockmod.fit(clock.window())
    clock.set_prior(TRUTH)  # a reload: refits at once with the new prior
    fits = clock.fits
    assert not clock.adopt(late) and clock.fits == fits
    older = clock.window()
    _feed(clock, TRUTH, np.random.default_rng(3), 40)  # a later fit was adopted since
    assert not clock.adopt(clockmod.fit(older))


def _feed(clock: StepClock, truth: CostModel, rng: np.random.Generator, steps: int,
          noise: float = 0.0, batch_range: tuple[int, int] = (1, 9),
          outlier_every: int = 0, skew: float = 0.0, prefill_skew: float = 0.0) -> None:
    """Steps of random batches (each job appears in two steps in a row), timed by truth;
    `skew`: each step x a lognormal factor of mean 1 (many steps a little fast, a few
    much slower, as on a shared CPU); `prefill_skew`: only the steps with a prefill."""
    now, ids = 0.0, 0
    for i in range(steps):
        batch = int(rng.integers(*batch_range))
        contexts = rng.integers(20, 800, batch)
        prefill = int(rng.integers(0, 300)) if i % 5 == 0 else 0
        jobs = [(f"j{ids + k}", int(c), 1) for k, c in enumerate(contexts)]
        if prefill:
            clock.started(jobs[0][0], prefill)
        if i % 2:
            ids += batch
        dt = truth.step_s(prefill, batch, float(contexts.sum()))
        dt *= 1 + noise * rng.standard_normal()
        spread = prefill_skew if prefill else skew
        dt *= rng.lognormal(-spread * spread / 2, spread) if spread else 1.0
        if outlier_every and i % outlier_every == outlier_every - 1:
            dt += 0.2  # a GC pause, a late loop
        now += dt
        if clock.step(now, jobs):
            clock.refit()


def test_a_few_hundred_noisy_steps_with_outliers_are_enough() -> None:
    clock = StepClock(CostModel())
    _feed(clock, TRUTH, np.random.default_rng(2), 400, noise=0.05, outlier_every=37)
    assert clock.fits >= 5
    for batch, context in ((2, 500), (8, 4000)):
        want = TRUTH.step_s(0, batch, context)
        assert clock.decode_step_s(batch, context) == pytest.approx(want, rel=0.05)


@pytest.mark.parametrize(("skew", "prefill_skew"), [(0.3, 0.0), (0.0, 0.6)])
def test_skewed_step_times_are_learned_at_their_mean(skew: float, prefill_skew: float) -> None:
    """Every step skewed slow: relative error alone would fit them 16 % low (exp(-2 x
    0.3^2)); the clock's steps add up to the time the engine took. Only the steps with a
    prefill skewed: the scale that makes them add up does not spill onto the plain decode
    steps, exactly timed."""
    clock = StepClock(CostModel())
    _feed(clock, TRUTH, np.random.default_rng(4), 1000, skew=skew, prefill_skew=prefill_skew)
    for batch, context in ((2, 500), (8, 4000)):
        want = TRUTH.step_s(0, batch, context)
        assert clock.decode_step_s(batch, context) == pytest.approx(want, rel=0.06)


def test_terms_the_traffic_never_varies_keep_the_priors_split() -> None:
    """Always 4 jobs: decode_base and decode_per_seq x 4 cannot be told apart; the sum is
    learned, the split stays near the prior's, and a batch of 4 is predicted right."""
    prior = CostModel(decode_base_s=0.004, decode_per_seq_s=0.001)
    clock = StepClock(prior)
    _feed(clock, TRUTH, np.random.default_rng(3), 200, batch_range=(4, 5))
    assert clock.decode_step_s(4, 1600) == pytest.approx(TRUTH.step_s(0, 4, 1600), rel=0.02)
    learned = clock.cost
    ratio = learned.decode_base_s / max(learned.decode_per_seq_s, 1e-12)
    assert ratio == pytest.approx(prior.decode_base_s / prior.decode_per_seq_s, rel=0.5)


def test_the_pooled_clock_is_the_mean_of_the_fitted_lanes() -> None:
    fast, slow, fresh = StepClock(), StepClock(), StepClock()
    _feed(fast, TRUTH, np.random.default_rng(4), 64)
    _feed(slow, CostModel.from_vector([2 * v for v in TRUTH.vector()]),
          np.random.default_rng(5), 64)
    pooled = clockmod.pooled([fast, slow, fresh], CostModel())
    want = (fast.decode_step_s(4, 1000) + slow.decode_step_s(4, 1000)) / 2
    assert pooled.step_s(0, 4, 1000) == pytest.approx(want, rel=1e-6)
    assert clockmod.pooled([fresh], TRUTH) == TRUTH  # none fitted: the prior


@pytest.mark.asyncio
async def test_fcfs_jobs_count_in_the_typical_service_by_their_prediction_not_budget() -> None:
    """fcfs queues a job before its prediction: its 4000-token budget must not make the
    typical service (aging's unit, Retry-After) 80x what its 50-token answer takes."""
    inbox: asyncio.Queue[Event] = asyncio.Queue()
    asked = AskedPredictor()
    core = Scheduler([Lane("e0", asyncio.Queue(), 1)], FCFS(), SchedulerConfig(max_running=1),
                     inbox, predictor=asked)
    core.accepting = True
    core.submit(Job(job_id="a", prompt_token_ids=[1] * 20, arrival_time=0.0,
                    sampling=SamplingSpec(max_tokens=4000)), OutputStream())
    core.handle(inbox.get_nowait())
    assert asked.jobs and core.estimates.typical_service_s == 0.0  # not counted yet
    core.handle(Predicted("a", 50.0, upper_tokens=90.0))
    cost = core.policy.cost
    assert core.estimates.typical_service_s == pytest.approx(cost.wall_s(20, 20, 50, 1))
