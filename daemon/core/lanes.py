"""The core's record of each executor (a lane): its command queue, the jobs it runs, their
predicted work and KV reservations, what its engine holds, its learned step times (its
clock), whether its engine serves, and its counters. Only the core's loop changes a lane;
policies read lanes as ExecutorViews, /metrics reads the counters and the clock."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

from daemon.core import admission
from daemon.core.clock import StepClock
from daemon.core.events import Capacity, Command, EngineDown, EngineFailed, EngineUp
from daemon.core.job import Job
from daemon.core.work import RunningWork

log = logging.getLogger(__name__)


class CommandQueue(Protocol):
    """An executor's command queue as the core sees it: it only puts."""

    def put_nowait(self, item: Command) -> None: ...


@dataclass(slots=True)
class LaneStats:
    """Counters per executor, read by /metrics at scrape time."""

    jobs_started: int = 0  # dispatches, resumes included
    jobs_finished: int = 0
    jobs_aborted: int = 0
    jobs_failed: int = 0
    preemptions: int = 0
    budget_yields: int = 0  # dispatches that ran out of their token budget (slices)
    tokens_generated: int = 0


@dataclass(slots=True)
class ResumeStats:
    """Resumed dispatches (after a preemption, a slice or an engine failure) whose first
    output the engine reported, and the context tokens they had to prefill again."""

    resumes: int = 0
    context_tokens: int = 0  # prompt + generated tokens of those resumes
    recomputed_tokens: int = 0  # prompt + generated tokens minus the engine's cached ones

    def add(self, context_tokens: int, cached_tokens: int) -> None:
        self.resumes += 1
        self.context_tokens += context_tokens
        self.recomputed_tokens += max(context_tokens - cached_tokens, 0)


@dataclass(slots=True, eq=False)
class Lane:
    name: str
    commands: CommandQueue  # the executor's inbox
    # Admission cap by count: scheduler.max_running, or the engine's max_num_seqs when it is
    # "auto" (changes on reload and with the engine's report).
    max_running: int
    # Jobs handed to the engine beyond max_running, to wait in its own queue
    # (scheduler.engine_queue), where max_running is the engine's own cap (engine_spare).
    spare: int = 0
    running: dict[str, Job] = field(default_factory=dict)  # launched, not yet stopped
    # Predicted work of the running jobs, kept in step with them (load(), placement).
    work: RunningWork = field(default_factory=RunningWork)
    # Admit by predicted KV footprint too (scheduler.max_running = "auto").
    memory_bound: bool = False
    # Under memory admission, start a job whose context fits in the KV held now even past
    # the projected peak (scheduler.admission "now" or "work-conserving"; not "peak")...
    work_conserving: bool = True
    # ... unless waiting for the peak is cheaper than the preemption ("work-conserving";
    # core/admission.py).
    prices_overcommit: bool = False
    # ... counting the KV held now from the engine's report where it can (held_now_blocks;
    # scheduler.engine_kv).
    engine_kv: bool = False
    # Backfill passes a blocked head only with jobs that end before its context finds room
    # now, not before its projected peak fits (scheduler.backfill_room, under "now").
    backfill_by_room: bool = False
    # The engine's last report with a step's output: its blocks in use (None: none yet) and
    # the requests queued inside it; and the jobs handed to it whose first output of this
    # dispatch has not come back yet (not in the report's blocks).
    reported_blocks: int | None = None
    reported_waiting: int = 0
    pending: set[str] = field(default_factory=set)
    capacity: Capacity | None = None  # what the engine holds, once it said
    kv: admission.KVLedger = field(default_factory=admission.KVLedger)  # reserved KV
    clock: StepClock = field(default_factory=StepClock)  # its engine's learned step times
    down_reason: str | None = None  # why its engine does not serve now; None = up
    failed: bool = False  # its engine could not be restarted: down for good
    stats: LaneStats = field(default_factory=LaneStats)
    # Decision rounds that left the next waiting job waiting while this lane had a free
    # slot and KV for its context now, by the rule that held it (decisions.hold_reason).
    held: dict[str, int] = field(default_factory=dict)
    resumes: ResumeStats = field(default_factory=ResumeStats)
    offloaded_resumes: ResumeStats = field(default_factory=ResumeStats)  # KV from kvstore

    @property
    def free_slots(self) -> int:
        if self.down_reason is not None or self._memory_full():
            return 0
        return max(self.max_running + self.engine_spare - len(self.running), 0)

    @property
    def engine_spare(self) -> int:
        """Jobs it may hand its engine past max_running: `spare` where the count cap is the
        engine's own batch cap (scheduler.max_running = "auto", once the engine said what
        it holds), so that they wait in the engine's queue; none under a number, which is
        the operator's cap on jobs admitted."""
        return self.spare if self.memory_bound and self.capacity is not None else 0

    def _memory_full(self) -> bool:
        if not (self.memory_bound and self.capacity is not None and self.running):
            return False
        held = self.held_now_blocks() if self.work_conserving else self.kv.peak_blocks()
        return held >= self.capacity.kv_blocks

    def held_now_blocks(self) -> int:
        """KV blocks the running jobs hold now, each with its next tokens: the ledger's
        count, or (engine_kv) the engine's report plus the jobs handed to it since, where
        that is lower and nothing of ours waits in the engine's queue but those just handed
        to it (a job the engine preempted waits there for its blocks: their room is not
        free). The ledger counts each job's context as the core last saw it."""
        ledger = self.kv.now_blocks()
        if (not self.engine_kv or self.reported_blocks is None
                or self.reported_waiting > len(self.pending)):
            return ledger
        pending, growth = self.kv.growth_blocks(self.pending)
        return min(ledger, self.reported_blocks + pending + growth)

    def report(self, kv_usage: float, engine_waiting: int) -> None:
        """What the engine said with a step's output (Tokens)."""
        if self.capacity is not None:
            self.reported_blocks = round(kv_usage * self.capacity.kv_blocks)
            self.reported_waiting = engine_waiting

    def room_now(self, context_tokens: int, without: frozenset[str] = frozenset()) -> bool:
        """Whether the KV held now (held_now_blocks; the ledger's where jobs named in
        `without` are leaving) leaves room for a job with this context and its next
        tokens."""
        if without:
            return admission.fits_now(self.capacity, self.kv, len(self.running),
                                      context_tokens, without)
        if self.capacity is None or not self.running:
            return True
        need = self.kv.blocks_for(context_tokens + admission.NOW_HEADROOM_TOKENS)
        return self.held_now_blocks() + need <= self.capacity.kv_blocks

    def fits_now(self, context_tokens: int, without: frozenset[str] = frozenset()) -> bool:
        """Whether a job with this context can start now beside the running jobs (but those
        in `without`) as they are (always, by count only; never where the lane admits by
        the projected peak alone)."""
        if not self.memory_bound:
            return True
        return self.work_conserving and self.room_now(context_tokens, without)

    def fits(self, kv_tokens: float, context_tokens: int = 0,
             without: frozenset[str] = frozenset()) -> bool:
        """Whether a job with this KV footprint (`context_tokens` of it its context now)
        may join now, or once the running jobs named in `without` have left (always, by
        count only)."""
        return not self.memory_bound or admission.fits(
            self.capacity, self.kv, len(self.running), kv_tokens, context_tokens, without)

    def engine_changed(self, event: EngineDown | EngineUp | EngineFailed | Capacity,
                       fixed_running: int | None) -> None:
        """Its engine went down, is up again, failed for good, or said what it holds."""
        match event:
            case EngineDown():
                self.down_reason = event.why
            case EngineUp():
                log.info("executor %s is up again", self.name)
                self.down_reason = None
            case EngineFailed():
                self.down_reason, self.failed = event.why, True
            case Capacity():
                self.set_capacity(event, fixed_running)

    def set_capacity(self, capacity: Capacity | None, fixed_running: int | None) -> None:
        """The engine's report (or None: keep it) and scheduler.max_running (None: auto)."""
        self.capacity = capacity or self.capacity
        if self.capacity is not None:
            self.kv.block_size = self.capacity.block_size
        self.memory_bound = fixed_running is None
        if fixed_running is not None:
            self.max_running = fixed_running
        elif self.capacity is not None:
            self.max_running = self.capacity.max_num_seqs

    def load(self) -> float:
        """Predicted outstanding work, in tokens, of the jobs admitted here: the running
        total of their predicted_remaining_tokens (daemon.core.work), O(1)."""
        return self.work.tokens

    def context_reads(self) -> float:
        """Context tokens the admitted jobs' predicted remaining decode steps read."""
        return self.work.context_reads

    def started(self, job: Job, context_tokens: int, cached_tokens: int) -> None:
        """A dispatch's first output is on its way: its step's prefill (for the clock), and
        what a resume had to prefill again."""
        self.pending.discard(job.job_id)
        self.clock.started(job.job_id, context_tokens - cached_tokens)
        if job.num_dispatches > 1:
            self.resumes.add(context_tokens, cached_tokens)
            if job.kv_offloaded:
                self.offloaded_resumes.add(context_tokens, cached_tokens)

    def advance(self, job: Job, token_ids: list[int], time: float) -> int:
        """One step's tokens for a running job; its context before them is returned."""
        if job.first_token_time is None:
            job.first_token_time = time
        context = job.num_context_tokens
        job.generated_token_ids.extend(token_ids)
        self.work.update(job)
        self.kv.grow(job.job_id, context + len(token_ids))
        return context

    def admit(self, job: Job, kv_tokens: float = 0.0) -> None:
        self.running[job.job_id] = job
        self.pending.add(job.job_id)
        self.work.add(job)
        self.kv.reserve(job.job_id, kv_tokens, job.num_context_tokens)

    def release(self, job_id: str) -> Job | None:
        """Take a job out (it stopped); None if it is not here (a stale report). A lane
        left empty has its clock forget the last step (idle time is no step time)."""
        job = self.running.pop(job_id, None)
        self.pending.discard(job_id)
        if job is not None:
            self.work.remove(job)
            self.kv.remove(job_id)
            self.clock.forget(job_id)
            if not self.running:
                self.clock.idle()
        return job
