"""Memory-aware admission (`scheduler.max_running = "auto"`): a lane admits jobs while the
predicted KV footprint of its running set fits its engine's KV cache, and never more than
the engine's max_num_seqs. The rest wait in lengthwise, where the policy orders them,
instead of in the engine, whose own preemption (recompute) is what a full cache costs.

A job's footprint is its context (prompt + generated tokens) plus the rest of its answer
at an upper quantile of its predicted length (the predictor's quantile head,
`Predicted.upper_tokens`; a predictor without one: the point prediction x `upper_factor`),
scaled by the core's length calibration, capped by its token budget where budgets are
trusted, in whole KV blocks. A job not predicted yet (fcfs queues before predicting)
counts the same quantile of recently observed answer lengths, or its whole budget until
MIN_OBSERVED were seen. A running job past its estimate counts its context plus one block.
A lane with nothing running admits any job: one bigger than the cache is the engine's
to handle.

The projection is an estimate from noisy predictions, and holding a job is a sure cost:
admission is work-conserving. A job whose context (and its next tokens) fits in the KV
the running jobs hold *now* starts even where the projected peak overflows, unless the
wait until the peak fits is shorter than the price of the preemption the overflow would
cause (`overcommit_pays`: the recompute of the job the engine would preempt, which stalls
every job in its batch). The engine's own preemption picks the job it ranks last (vLLM's
priority scheduling: by default the class, then the job started last, often the new job
itself, whose own recompute is then the price; core/decisions.py, admits), so prediction
chooses which job starts, not whether the cache idles.

What must fit is the *peak* of the running set's projected KV, not the sum of the
footprints: job i holds its context c_i + t at t steps from now until its answer ends at
r_i (its footprint minus its context), then frees it, so the set holds
sum over {i: r_i >= t} of (c_i + t), largest at one of the r_k. Jobs end at different
times, so the peak is below the sum (the sum assumes every job at its longest at once),
and the cache is not left idle for the jobs admitted to it. (LightLLM's past-future
scheduler projects future memory the same way.)

The executor reports what its engine holds (a Capacity event: when it starts, after each
restart); until then a lane admits by count only.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Collection, Mapping, Sequence

import numpy as np

from daemon.core.events import Capacity
from daemon.core.job import Job

MIN_OBSERVED = 20  # observed answers before their quantile stands in for a missing prediction
_RECENT = 256  # observed answers kept
_REQUANTILE_EVERY = 16  # observations between recomputations of their quantile
# Tokens of growth each running job is given on top of its context when the KV held now is
# counted: the engine runs ahead of the core by the steps in flight (a round trip).
NOW_HEADROOM_TOKENS = 16


class KVLedger:
    """The KV tokens reserved for each running job of one lane and their sum in blocks,
    one O(1) update per change."""

    __slots__ = ("_context", "_of", "block_size", "blocks")

    def __init__(self) -> None:
        self.block_size = 16  # tokens per block: the engine's, once reported
        self.blocks = 0  # reserved by the running jobs (the sum of their footprints)
        self._of: dict[str, tuple[float, int]] = {}  # job id -> (tokens, blocks)
        self._context: dict[str, int] = {}  # job id -> its context now (tokens)

    def blocks_for(self, tokens: float) -> int:
        return max(math.ceil(tokens / self.block_size), 1)

    def reserve(self, job_id: str, tokens: float, context_tokens: int | None = None) -> None:
        """Set the job's reservation (replacing any earlier one) and, if given, its context
        now (else the one it had; 0 for a job never seen)."""
        context = self._context.get(job_id, 0) if context_tokens is None else context_tokens
        self.remove(job_id)
        blocks = self.blocks_for(tokens)
        self._of[job_id] = (tokens, blocks)
        self._context[job_id] = context
        self.blocks += blocks

    def grow(self, job_id: str, context_tokens: int) -> None:
        """The job's context grew: a job past its reservation reserves one block more."""
        held = self._of.get(job_id)
        if held is None:
            return
        self._context[job_id] = context_tokens
        if context_tokens + 1 > held[0]:
            self.reserve(job_id, context_tokens + self.block_size)

    def remove(self, job_id: str) -> None:
        held = self._of.pop(job_id, None)
        self._context.pop(job_id, None)
        if held is not None:
            self.blocks = self.blocks - held[1] if self._of else 0

    def peak_blocks(self, extra: Sequence[tuple[int, float]] = (),
                    without: frozenset[str] = frozenset()) -> int:
        """Blocks the running jobs (but those named in `without`; and `extra`: jobs' context
        and footprint, tokens) hold at the peak of their projected KV (module doc), each
        job's partial block counted whole. O(n log n)."""
        jobs = [(self._context[job_id], tokens) for job_id, (tokens, _) in self._of.items()
                if job_id not in without]
        jobs += extra
        # (answer tokens left, context now), longest answer first
        ends = sorted(((max(tokens - context, 0.0), context) for context, tokens in jobs),
                      reverse=True)
        peak, contexts = 0.0, 0.0
        for active, (rest, context) in enumerate(ends, start=1):
            contexts += context
            peak = max(peak, (contexts + active * rest) / self.block_size + active)
        return math.ceil(peak)

    def now_blocks(self, extra_contexts: Sequence[int] = (),
                   without: frozenset[str] = frozenset(), grown_tokens: int = 0) -> int:
        """Blocks the running jobs (but those in `without`, each `grown_tokens` longer; and
        jobs of `extra_contexts` tokens) hold now, each with NOW_HEADROOM_TOKENS of growth.
        O(n)."""
        held = [context + grown_tokens for job_id, context in self._context.items()
                if job_id not in without]
        return sum(self.blocks_for(context + NOW_HEADROOM_TOKENS)
                   for context in (*held, *extra_contexts))

    def growth_blocks(self, pending: Collection[str]) -> tuple[int, int]:
        """(blocks the `pending` jobs hold now with their next tokens, the blocks the next
        tokens of the others add to what they hold): what an engine's report of its blocks in
        use, which counts the others as they are and not the pending ones, lacks. O(n)."""
        held, growth = 0, 0
        for job_id, context in self._context.items():
            if job_id in pending:
                held += self.blocks_for(context + NOW_HEADROOM_TOKENS)
            else:
                growth += (self.blocks_for(context + NOW_HEADROOM_TOKENS)
                           - self.blocks_for(context))
        return held, growth

    def contexts(self) -> Mapping[str, int]:
        """Each running job's context now (tokens), as the core last saw it (read-only: the
        ledger's own, not a copy)."""
        return self._context

    def __len__(self) -> int:
        return len(self._of)


class Footprints:
    """Each job's predicted KV footprint in tokens, with what the core learned: the length
    calibration (`scale`) and recently observed answer lengths."""

    def __init__(self, quantile: float, upper_factor: float) -> None:
        self.quantile = quantile  # level of the upper estimate
        self.upper_factor = upper_factor  # upper / point where no quantile was predicted
        self._recent: collections.deque[int] = collections.deque(maxlen=_RECENT)
        self._since = 0  # observations since the quantile was computed
        self._recent_upper: float | None = None
        # The recent lengths sorted, and the mean of each suffix (residual()).
        self._sorted = np.zeros(0)
        self._suffix_mean = np.zeros(0)

    def observe(self, job: Job) -> None:
        """A job ended: its answer's length, if known, joins the recent ones."""
        actual = job.observed_output_tokens
        if actual is None:
            return
        self._recent.append(actual)
        self._since += 1
        if len(self._recent) >= MIN_OBSERVED and (
                self._recent_upper is None or self._since >= _REQUANTILE_EVERY):
            self._sorted = np.sort(np.asarray(self._recent, dtype=float))
            self._recent_upper = float(np.quantile(self._sorted, self.quantile))
            n = len(self._sorted)
            self._suffix_mean = np.cumsum(self._sorted[::-1])[::-1] / np.arange(n, 0, -1)
            self._since = 0

    def residual(self, generated: int) -> float | None:
        """Tokens still to come, on average, of the recent answers longer than `generated`:
        what a job that has generated that many, past its own prediction, may still need.
        None when no recent answer was longer (or too few were seen)."""
        i = int(np.searchsorted(self._sorted, generated, side="right"))
        if i >= len(self._sorted):
            return None
        return float(self._suffix_mean[i]) - generated

    def upper_output(self, job: Job, scale: float) -> float | None:
        """Total output tokens at the upper estimate; None when nothing is known."""
        point = job.predicted_output_tokens
        if job.predicted_upper_tokens is not None:
            return max(job.predicted_upper_tokens, point or 0.0) * scale
        if point is not None:
            return point * self.upper_factor * scale
        return self._recent_upper

    def tokens(self, job: Job, scale: float, budget_caps: bool = True) -> float:
        """Prompt + generated + the rest of the answer at the upper estimate."""
        generated = job.num_generated_tokens
        budget = max(job.num_remaining_budget_tokens, 1)
        upper = self.upper_output(job, scale)
        rest = float(budget) if upper is None else max(upper - generated, 1.0)
        if budget_caps or upper is None:
            rest = min(rest, budget)
        return job.num_prompt_tokens + generated + rest


def fits(capacity: Capacity | None, ledger: KVLedger, running: int, tokens: float,
         context_tokens: int = 0, without: frozenset[str] = frozenset()) -> bool:
    """Whether a job of footprint `tokens` (`context_tokens` of them its context now) fits
    beside the lane's `running` jobs (but those named in `without`, running jobs that are
    leaving): the peak of their projected KV with it."""
    if capacity is None or running <= len(without):
        return True
    return ledger.peak_blocks([(context_tokens, tokens)], without) <= capacity.kv_blocks


def fits_now(capacity: Capacity | None, ledger: KVLedger, running: int, context_tokens: int,
             without: frozenset[str] = frozenset()) -> bool:
    """Whether a job with `context_tokens` of context can start now: it and the running jobs
    (but those in `without`) fit in the cache as they are, each with its next tokens."""
    if capacity is None or running <= len(without):
        return True
    return ledger.now_blocks([context_tokens], without) <= capacity.kv_blocks


def overcommit_pays(wait_s: float, victim_context_tokens: int, batch: int,
                    prefill_s: Callable[[int], float]) -> bool:
    """Whether starting a job now, past the projected peak, beats holding it `wait_s`: the
    overflow costs (at most) one recompute of the victim's context, during which the
    `batch` jobs beside it wait (the learned clock's `prefill_s`)."""
    return wait_s > prefill_s(victim_context_tokens) * max(batch, 1)


def seconds_until_fits(capacity: Capacity | None, ledger: KVLedger,
                       ends: list[tuple[float, str]], tokens: float,
                       context_tokens: int = 0,
                       before: Sequence[tuple[int, float]] = ()) -> float:
    """Seconds from now until a job of footprint `tokens` fits, if the running jobs end at
    their predicted times (`ends`: (seconds from now, job id), soonest first): the first end
    after which the peak with it fits, beside the jobs that take their room first (`before`:
    their contexts and footprints, counted as held from now on). A lane left empty admits
    any job. O(n log^2 n)."""
    if capacity is None or not ends:
        return 0.0
    extra = [*before, (context_tokens, tokens)]
    if ledger.peak_blocks(extra) <= capacity.kv_blocks:
        return 0.0
    lo, hi = 1, len(ends)  # the fewest ends after which it fits: in (lo - 1, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        gone = frozenset(job_id for _, job_id in ends[:mid])
        if ledger.peak_blocks(extra, gone) <= capacity.kv_blocks:
            hi = mid
        else:
            lo = mid + 1
    return ends[hi - 1][0]


def seconds_until_room(capacity: Capacity | None, ledger: KVLedger,
                       ends: list[tuple[float, str]], context_tokens: int,
                       before: Sequence[int] = (), step_s: float = 0.0) -> float:
    """Seconds from now until a job with `context_tokens` of context finds room in the KV
    held now (fits_now), which is when work-conserving admission starts it, if the running
    jobs end at their predicted times (`ends`: (seconds from now, job id), soonest first)
    and grow by a token every `step_s` until then, beside the contexts of the jobs that
    start first (`before`). Not the projected peak (seconds_until_fits): that forecast
    waits for room the engine does not wait for. A lane left empty admits any job.
    O(n log n)."""
    if capacity is None or not ends:
        return 0.0

    def fits_after(k: int) -> bool:  # once the first k running jobs have ended
        seconds = ends[k - 1][0] if k else 0.0
        # (an end never predicted, inf, leaves no running job behind it to grow)
        grown = int(seconds / step_s) if step_s > 0 and math.isfinite(seconds) else 0
        gone = frozenset(job_id for _, job_id in ends[:k])
        return ledger.now_blocks([*before, context_tokens], gone, grown) <= capacity.kv_blocks

    if fits_after(0):
        return 0.0
    lo, hi = 1, len(ends)  # the fewest ends after which it fits: in (lo - 1, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        if fits_after(mid):
            hi = mid
        else:
            lo = mid + 1
    return ends[hi - 1][0]


def seconds_until_started(capacity: Capacity, ledger: KVLedger,
                          ends: Sequence[tuple[float, str]], context_tokens: int,
                          ahead: Sequence[tuple[int, float]] = (), step_s: float = 0.0,
                          slots: float = math.inf) -> float:
    """Seconds from now until work-conserving admission starts a job with `context_tokens`
    of context behind the jobs `ahead` of it ((context, predicted seconds of service), in
    the order they go), on one lane: the running jobs end at their predicted times (`ends`,
    as seconds_until_room) and grow a token every `step_s`; at each end, the jobs at the
    head of the line start while their contexts fit in the KV held now (fits_now) and
    fewer than `slots` jobs run, and then hold their context and grow until their own
    predicted ends. Queue and memory in one forecast: the jobs ahead take the room that
    frees and give it back when they end, which neither a count of typical-footprint slots
    nor the room alone sees. A lane left empty starts its next job whatever its size.
    O((n + m) x n) for n running and m ahead; inf when a job at the head can start only
    after an end never predicted."""
    size, headroom = ledger.block_size, NOW_HEADROOM_TOKENS
    contexts = ledger.contexts()
    rate = 1.0 / step_s if step_s > 0 else 0.0  # tokens each running job grows a second
    # Each running job's predicted end, and its context with its next tokens less its
    # growth until now: at time t it holds ceil((base + t x rate) / size) blocks.
    end = np.array([seconds for seconds, _ in ends], dtype=float)
    base = np.array([contexts.get(job_id, 0) + headroom for _, job_id in ends], dtype=float)
    line = [*ahead, (context_tokens, 0.0)]
    now, started = 0.0, 0
    while True:
        held = int(np.ceil((base + now * rate) / size).sum())
        running, ends_new, bases_new = len(end), [], []
        while started < len(line) and running < slots:
            context, service_s = line[started]
            need = math.ceil((context + headroom) / size)
            if running and held + need > capacity.kv_blocks:
                break
            if started == len(line) - 1:
                return now
            ends_new.append(now + service_s)
            bases_new.append(context + headroom - now * rate)
            held, running, started = held + need, running + 1, started + 1
        if ends_new:
            end, base = np.append(end, ends_new), np.append(base, bases_new)
        if not running:
            return math.inf  # no slot at all
        now = float(end.min())
        if not math.isfinite(now):
            return math.inf
        left = end > now
        end, base = end[left], base[left]
