"""Memory-aware admission (daemon/core/admission.py, scheduler.max_running = "auto"): the
real core driven by hand, the engine's KV cache as a Capacity event, Launch commands out."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.config import AgingConfig, SchedulerConfig
from daemon.core.admission import MIN_OBSERVED, Footprints
from daemon.core.admission import fits_now as admission_fits_now
from daemon.core.events import Capacity, Event, Launch, Predicted, Stopped, Tokens
from daemon.core.job import Job, JobStatus, SamplingSpec
from daemon.core.lanes import Lane
from daemon.core.policy import Policy
from daemon.core.scheduler import Scheduler
from daemon.core.stream import OutputStream
from policies.fcfs import FCFS
from policies.ssjf import SSJF
from tests.core.fakes import AskedPredictor


class Core:
    def __init__(self, lanes: int = 1, max_running: int | str = "auto",
                 upper_factor: float = 2.0, admission: str = "peak", engine_queue: int = 0,
                 aging_preempt: bool = False, engine_order: str = "policy",
                 policy: Policy | None = None) -> None:
        """admission: "peak" (the projection alone, which most tests here are about),
        "work-conserving" or "now" (the default); engine_queue: 0 (the count cap alone, which most
        tests here are about) or the default 1; aging_preempt: whether a promoted job
        preempts (off: the default); policy: FCFS unless given."""
        self.inbox: asyncio.Queue[Event] = asyncio.Queue()
        self.commands = [asyncio.Queue[object]() for _ in range(lanes)]
        config = SchedulerConfig(max_running=max_running, upper_factor=upper_factor,  # type: ignore[arg-type]
                                 admission=admission, engine_queue=engine_queue,  # type: ignore[arg-type]
                                 aging=AgingConfig(preempt=aging_preempt),
                                 engine_order=engine_order)  # type: ignore[arg-type]
        self.core = Scheduler([Lane(f"e{i}", q, 8) for i, q in enumerate(self.commands)],
                              policy or FCFS(), config, self.inbox)
        self.core.accepting = True

    def capacity(self, blocks: int, max_num_seqs: int = 8, lane: int = 0) -> None:
        self.inbox.put_nowait(Capacity(f"e{lane}", blocks, 16, max_num_seqs))

    def submit(self, *jobs: Job) -> None:
        for job in jobs:
            self.core.submit(job, OutputStream())

    def turn(self, lane: int = 0) -> list[str]:
        """Handle the events at hand, run a decision round: the jobs launched on `lane`."""
        while not self.inbox.empty():
            self.core.handle(self.inbox.get_nowait())
        self.core.dispatch()
        launched = []
        while not self.commands[lane].empty():
            command = self.commands[lane].get_nowait()
            assert isinstance(command, Launch)
            launched.append(command.job_id)
        return launched

    def finish(self, job_id: str, lane: int = 0) -> None:
        self.inbox.put_nowait(Stopped(f"e{lane}", job_id, "stop"))


def job(job_id: str, prompt: int = 32, predicted: float | None = 60.0,
        upper: float | None = 100.0, max_tokens: int = 1000) -> Job:
    return Job(job_id=job_id, prompt_token_ids=[1] * prompt, arrival_time=0.0,
               sampling=SamplingSpec(max_tokens=max_tokens), predicted_output_tokens=predicted,
               predicted_upper_tokens=upper)


@pytest.mark.asyncio
async def test_admits_while_the_predicted_footprint_fits_then_as_memory_frees() -> None:
    c = Core()
    c.capacity(blocks=40)  # 640 tokens of KV
    # Each: 32 prompt + 100 (upper quantile) = 132 tokens = 9 blocks: 4 fit (36 of 40).
    c.submit(*(job(f"j{i}") for i in range(6)))
    assert c.turn() == ["j0", "j1", "j2", "j3"]
    lane = c.core.lanes[0]
    assert lane.kv.blocks == 36 and len(c.core.waiting) == 2
    assert lane.max_running == 8  # the count cap is the engine's max_num_seqs
    c.finish("j0")
    assert c.turn() == ["j4"]  # 9 blocks freed, 9 taken
    c.finish("j1")
    c.finish("j2")
    assert c.turn() == ["j5"]
    assert lane.kv.blocks == 27


@pytest.mark.asyncio
async def test_never_above_max_num_seqs_and_a_lone_job_always_runs() -> None:
    c = Core()
    c.capacity(blocks=10_000, max_num_seqs=3)
    c.submit(*(job(f"s{i}", prompt=4, upper=8.0) for i in range(5)))
    assert c.turn() == ["s0", "s1", "s2"]  # memory for all, seats for three
    for i in range(3):
        c.finish(f"s{i}")
    assert c.turn() == ["s3", "s4"]
    c.finish("s3")
    c.finish("s4")
    c.turn()
    c.capacity(blocks=4)  # after a restart: a smaller cache than one job needs
    c.submit(job("huge", prompt=200), job("next", prompt=4, upper=8.0))
    assert c.turn() == ["huge"]  # an empty engine takes it (the engine's to handle)
    assert c.turn() == []  # nothing fits beside it
    c.finish("huge")
    assert c.turn() == ["next"]


@pytest.mark.asyncio
async def test_one_job_past_the_engines_own_cap_waits_in_its_queue_never_past_a_number_or_memory(
        ) -> None:
    """scheduler.engine_queue (1 by default): a slot that frees refills at the engine's next
    step from the job waiting in its queue. Only where the count cap is the engine's own
    (max_running "auto"): a number is the operator's cap on admitted jobs, below the
    engine's (where the engine would run the extra job) or equal to it; and a full KV
    ledger admits nothing more."""
    assert SchedulerConfig().engine_queue == 1
    c = Core(engine_queue=1)
    c.capacity(blocks=10_000, max_num_seqs=3)
    c.submit(*(job(f"s{i}", prompt=4, upper=8.0) for i in range(6)))
    assert c.turn() == ["s0", "s1", "s2", "s3"]  # three run, s3 waits in the engine's queue
    assert c.turn() == []
    c.finish("s0")
    assert c.turn() == ["s4"]  # s3 took the freed slot; s4 waits in the engine's queue

    capped = Core(max_running=2, engine_queue=1)
    capped.capacity(blocks=10_000, max_num_seqs=3)
    capped.submit(*(job(f"c{i}", prompt=4, upper=8.0) for i in range(4)))
    assert capped.turn() == ["c0", "c1"]  # the engine has a third seat: no spare
    equal = Core(max_running=3, engine_queue=1)
    equal.capacity(blocks=10_000, max_num_seqs=3)
    equal.submit(*(job(f"e{i}", prompt=4, upper=8.0) for i in range(4)))
    assert equal.turn() == ["e0", "e1", "e2"]  # the operator's number is the cap

    full = Core(engine_queue=1)
    full.capacity(blocks=20, max_num_seqs=3)  # 320 tokens: two jobs of 9 blocks
    full.submit(*(job(f"f{i}") for i in range(4)))
    assert full.turn() == ["f0", "f1"]  # memory, not the count, holds f2 and f3


@pytest.mark.asyncio
async def test_the_head_job_that_does_not_fit_waits_and_longer_jobs_do_not_overtake_it() -> None:
    """A big job at the head is not overtaken by a job that would outlast its wait."""
    c = Core()
    c.capacity(blocks=20)
    # long: 4 + 100 tokens = 7 blocks would fit beside a, but its 100 steps outlast a's 60
    c.submit(job("a", upper=100.0), job("big", prompt=100, upper=150.0),
             job("long", prompt=4, predicted=100.0, upper=100.0))
    assert c.turn() == ["a"]  # a: 9 blocks; big: 16 blocks do not fit beside it
    assert [j.job_id for j in c.core.waiting] == ["big", "long"]
    c.finish("a")
    assert c.turn() == ["big"]  # 16 blocks; long's 7 no longer fit


@pytest.mark.asyncio
@pytest.mark.parametrize("room", [False, True])
async def test_under_admission_now_backfill_may_end_before_the_heads_room_frees(room: bool
                                                                                 ) -> None:
    """Backfill passes a blocked head with jobs that end before its projected peak would
    fit; with scheduler.backfill_room (off by default), under admission "now", only with
    jobs that end before its context finds room in the KV held now, which is when that
    admission starts it (sooner)."""
    assert not SchedulerConfig().backfill_room
    c = Core(admission="now")
    c.core.config = msgspec.structs.replace(c.core.config, backfill_room=room)
    c.core.estimates.adopt(c.core.policy, c.core.config)
    c.capacity(blocks=20)
    # r1 holds 10 blocks now and ends in 10 steps; r2 holds 8 and ends in 100
    c.submit(job("r1", prompt=130, predicted=10.0, upper=10.0),
             job("r2", prompt=100, predicted=100.0, upper=100.0))
    assert c.turn() == ["r1", "r2"]
    # head: 4 blocks now (room once r1 ends), its peak fits only once r2 has ended too;
    # small: 30 steps, fits beside both at the peak
    c.submit(job("head", prompt=40, predicted=300.0, upper=300.0),
             job("small", prompt=4, predicted=30.0, upper=30.0))
    assert c.turn() == ([] if room else ["small"])
    c.finish("r1")
    assert c.turn() == (["head", "small"] if room else ["head"])


@pytest.mark.asyncio
@pytest.mark.parametrize("backfill", [True, False])
async def test_a_job_that_ends_before_the_blocked_head_could_start_goes_first(
        backfill: bool) -> None:
    """EASY backfilling: memory the head cannot use until a ends serves a short job now."""
    c = Core()
    c.core.config = SchedulerConfig(backfill=backfill)
    c.capacity(blocks=20)
    c.submit(job("a", upper=100.0), job("big", prompt=100, upper=150.0),
             job("small", predicted=2.0, upper=4.0))  # 36 tokens: 3 blocks, 2 steps
    if not backfill:
        assert c.turn() == ["a"]  # vLLM's way: everything behind the head waits
        return
    assert c.turn() == ["a", "small"]
    assert [j.job_id for j in c.core.waiting] == ["big"]
    c.finish("a")
    assert c.turn() == ["big"]  # 16 + small's 3 blocks: the head was not delayed


@pytest.mark.asyncio
async def test_what_the_footprint_is_made_of() -> None:
    c = Core(upper_factor=3.0)
    c.capacity(blocks=1000)
    lane = c.core.lanes[0]
    c.submit(job("q", upper=100.0), job("point", upper=None), job("none", predicted=None,
                                                                  upper=None, max_tokens=500),
             job("capped", upper=100.0, max_tokens=20))
    assert c.turn() == ["q", "point", "none", "capped"]
    held = {job_id: tokens for job_id, (tokens, _) in lane.kv._of.items()}
    assert held == {"q": 132, "point": 32 + 60 * 3, "none": 32 + 500, "capped": 32 + 20}
    # A running job that reaches its reservation reserves a block more each time.
    for _ in range(100):
        c.inbox.put_nowait(Tokens("e0", 0.0, [("q", [5])]))
    c.turn()
    assert lane.kv._of["q"][0] == 32 + 100 + 16
    # A new prediction of a running job (fcfs predicts while it runs) re-reserves it.
    c.inbox.put_nowait(Predicted("none", 40.0, upper_tokens=90.0))
    c.turn()
    assert lane.kv._of["none"][0] == 32 + 90


def test_recent_answers_stand_in_for_missing_predictions_and_overrun_ones() -> None:
    prints = Footprints(quantile=0.9, upper_factor=2.0)
    blind = job("blind", predicted=None, upper=None, max_tokens=2000)
    assert prints.tokens(blind, 1.0) == 32 + 2000  # nothing known: the budget
    for n in range(MIN_OBSERVED):
        done = job(f"d{n}", predicted=None, upper=None)
        done.generated_token_ids = [1] * (10 * (n + 1))
        done.status, done.finish_reason = JobStatus.FINISHED, "stop"
        prints.observe(done)
    assert prints.tokens(blind, 1.0) == pytest.approx(32 + 181, abs=1)  # p90 of 10..200
    # Calibration scales predictions (4x too long here), not observed lengths.
    assert prints.tokens(job("p", upper=400.0), 0.25) == 32 + 100
    # A job 95 tokens in, past its prediction: the answers longer than that (100..200)
    # had 150 on average, so 55 more to come; none was longer than 200.
    assert prints.residual(95) == pytest.approx(150 - 95)
    assert prints.residual(200) is None


@pytest.mark.asyncio
async def test_a_fixed_max_running_admits_by_count_whatever_memory() -> None:
    c = Core(max_running=2)
    c.capacity(blocks=1)
    c.submit(*(job(f"f{i}") for i in range(3)))
    assert c.turn() == ["f0", "f1"]
    assert c.core.lanes[0].max_running == 2


@pytest.mark.asyncio
async def test_a_job_that_fits_only_elsewhere_goes_there() -> None:
    c = Core(lanes=2)
    c.capacity(blocks=20, lane=0)
    c.capacity(blocks=100, lane=1)
    c.submit(job("x", upper=100.0), job("y", upper=100.0))  # 9 blocks each
    launched = c.turn(0)
    other = c.turn(1)
    assert sorted(launched + other) == ["x", "y"] and len(launched) == len(other) == 1
    c.submit(job("wide", prompt=300, upper=100.0))  # 25 blocks: lane 1 only
    assert c.turn(0) == [] and c.turn(1) == ["wide"]


@pytest.mark.asyncio
async def test_work_conserving_admission_starts_what_fits_now_past_the_projected_peak(
) -> None:
    """The projection says 4 of these fit (9 blocks each at their upper estimate), but each
    holds 3 blocks now (32 prompt tokens + headroom): while the wait for the peak is longer
    than a preemption's price, every job whose context fits now starts."""
    c = Core(admission="work-conserving")
    c.capacity(blocks=40)
    c.submit(*(job(f"j{i}") for i in range(6)))
    assert c.turn() == [f"j{i}" for i in range(6)]


@pytest.mark.asyncio
async def test_work_conserving_admission_holds_what_does_not_fit_now() -> None:
    """Contexts of 300 tokens: 20 blocks each with headroom, so two fill the 40 blocks now and
    a third cannot start, whatever the projection."""
    c = Core(admission="work-conserving")
    c.capacity(blocks=40)
    c.submit(*(job(f"j{i}", prompt=300) for i in range(3)))
    assert c.turn() == ["j0", "j1"]
    c.finish("j0")
    assert c.turn() == ["j2"]


@pytest.mark.asyncio
async def test_work_conserving_admission_waits_when_the_wait_is_cheaper_than_a_preemption(
) -> None:
    """A running job of a less urgent class (vLLM's victim, whatever starts after it) with a
    long context is two tokens from its end: room frees sooner (two full-batch decode
    steps, ~27 ms on the default cost model) than a recompute of its 1,600 tokens would take
    (~36 ms), so a job that fits now but overflows the projection waits. Of the same class
    the new job would be vLLM's victim itself (started last): its own 200-token recompute
    is cheaper than the wait, and it starts. Under admission = "now" it starts as in vLLM's
    own scheduler, whatever the preemption costs."""
    for priority, starts, admission in ((5, [], "work-conserving"),
                                        (0, ["next"], "work-conserving"),
                                        (5, ["next"], "now")):  # whatever the price
        c = Core(admission=admission)
        c.capacity(blocks=120)
        long = job("long", prompt=1600, predicted=2.0, upper=2.0, max_tokens=2)
        long.priority = priority
        c.submit(long)
        assert c.turn() == ["long"]
        c.submit(job("next", prompt=200, predicted=200.0, upper=1800.0, max_tokens=2000))
        assert c.turn() == starts
        if not starts:
            c.finish("long")
            assert c.turn() == ["next"]


@settings(max_examples=60, deadline=None)
@given(running=st.lists(st.integers(1, 400), max_size=6),
       waiting=st.lists(st.tuples(st.integers(1, 400), st.floats(1, 800)), min_size=1,
                        max_size=6),
       blocks=st.integers(8, 80),
       admission=st.sampled_from(["work-conserving", "now", "peak"]))
def test_no_round_leaves_a_job_that_fits_now_waiting_without_a_counted_reason(
        running: list[int], waiting: list[tuple[int, float]], blocks: int,
        admission: str) -> None:
    """Property: after any decision round that leaves a job waiting while a slot is free,
    the round counted why it waits; "cache-full" exactly where its context (and its next
    tokens) does not fit in the KV held now."""

    async def scenario() -> None:
        c = Core(admission=admission)
        c.capacity(blocks=blocks)
        c.submit(*(job(f"r{i}", prompt=p, predicted=50.0, upper=100.0)
                   for i, p in enumerate(running)))
        c.turn()
        lane = c.core.lanes[0]
        before = dict(lane.held)
        c.submit(*(job(f"w{i}", prompt=p, predicted=u / 2, upper=u)
                   for i, (p, u) in enumerate(waiting)))
        c.turn()
        head = c.core.waiting.best(c.core.now(), 1)
        if head and lane.free_slots > 0:
            assert sum(lane.held.values()) > sum(before.values())
            full = lane.held.get("cache-full", 0) > before.get("cache-full", 0)
            assert full == (not admission_fits_now(lane.capacity, lane.kv, len(lane.running),
                                                   head[0].num_context_tokens))

    asyncio.run(scenario())


@pytest.mark.asyncio
async def test_an_uncontended_job_starts_before_its_prediction_a_contended_one_waits() -> None:
    """ssjf orders by prediction, but a job with nothing to be ordered against (an idle
    lane, nobody waiting) starts at once, its prediction arriving while it runs; once jobs
    compete for the lane, a new one is held for its prediction as before."""
    inbox: asyncio.Queue[Event] = asyncio.Queue()
    commands: asyncio.Queue[object] = asyncio.Queue()
    asked = AskedPredictor()
    core = Scheduler([Lane("e0", commands, 1)], SSJF(), SchedulerConfig(max_running=1),  # type: ignore[arg-type]
                     inbox, predictor=asked)
    core.accepting = True
    for name in ("first", "second"):
        core.submit(Job(job_id=name, prompt_token_ids=[1] * 20, arrival_time=0.0,
                        sampling=SamplingSpec(max_tokens=100)), OutputStream())
    core.handle(inbox.get_nowait())
    core.dispatch()
    launched = commands.get_nowait()
    assert isinstance(launched, Launch) and launched.job_id == "first"
    core.handle(inbox.get_nowait())  # "second": the slot is taken, so it waits to be ranked
    core.dispatch()
    assert commands.empty() and len(core.waiting) == 0 and [j.job_id for j in asked.jobs] == [
        "first", "second"]
    core.handle(Predicted("first", 40.0))  # the running job's prediction still lands
    assert core.lanes[0].running["first"].predicted_output_tokens == 40.0

