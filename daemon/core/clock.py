"""The daemon's own clock: each executor's engine step times, learned online from the steps
it serves, so that every estimate in seconds (aging bounds, ALISE's times, SCLS's batches,
placement, Retry-After, the estimated wait) is in its engine's seconds, not a generic
engine's.

Learned in the core, per lane, from the events it already gets, not from a step-timing
event of the executors': the core receives one Tokens event per engine step, stamped with
the loop time its output arrived, and each dispatch's Started event (its context and the
engine's cached tokens) just before that dispatch's first Tokens. That is everything a
step's cost depends on (tokens prefilled, batch, context) and its duration (the interval
since the lane's previous step). So one code path serves every executor (vLLM, simulated;
real or virtual time), no event is added per step, and what is measured is the step period
the daemon experiences, the engine's output handling included.

The model is CostModel's (so policies read the learned coefficients through the interface
they already use):
    step_s = prefill_base x [prefill > 0] + prefill_per_token x prefill
             + n x (decode_base + decode_per_seq x batch + decode_per_context_token x context)
for a step that gave each of `batch` jobs `n` tokens (n > 1 only when the loop merged
steps), with `context` tokens cached in the batch before it.

Idle gaps never count: an interval is a step sample only if some job got tokens in both
steps (the engine had work all along); a lane that empties forgets its last step.

Fit: non-negative least squares on relative error (as `lengthwise profile` fits) over the
last WINDOW samples, pulled weakly toward the prior (the configured cost model, scaled by
how much faster or slower the engine is overall; PRIOR_WEIGHT), so that terms the traffic
does not vary (a batch that is always 4) keep the prior's ratio; one trimming pass drops
outliers (a GC pause, a late loop); then scaled so that the kept steps' predicted times add
up to their measured ones (relative error alone fits the skewed step times low). A fit is
due after 8, 16, 32, ... samples, then every REFIT_EVERY: within the first second of
traffic on a CPU engine (steps of a few ms). `fit` is a pure function of a copy of the
window (`StepClock.window`), so the core runs it in a worker thread and adopts the result
when it comes back (`StepClock.adopt`): ~1 ms alone, it took 65 ms beside a thread busy in
Python (bench.clockfit) and was caught holding the daemon's loop for 1.3-3.0 s
(docs/results/2026-11-30-fit-stalls-and-ttft-by-parts.md). The simulator and tests fit
inline (`StepClock.refit`), where virtual time needs it deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np
from scipy.optimize import lsq_linear

from daemon.core.costmodel import TERMS, CostModel

WINDOW = 1024  # most recent step samples the fit reads
# Pull toward the prior (scaled to the engine's overall speed): a term 100 % off it costs
# what one sample 10 % off costs. Weak on purpose: it only settles what the traffic does not
# vary.
PRIOR_WEIGHT = 0.01
MIN_SAMPLES = 8  # samples before the first fit: the prior until then
REFIT_EVERY = 256  # samples between fits once the doubling reaches it
_TRIM_PASSES = 2
_SOLVE_ITERATIONS = 50  # bvls iterations at most (a 5-term fit converges in a few)
_TRIM_Z = 4.0  # samples further than this many robust deviations are outliers
_MIN_TRIM = 0.05  # ... and never closer than 5 % relative error
_MAD_SIGMA = 1.4826  # median absolute deviation -> standard deviation (normal errors)


class Window(NamedTuple):
    """What one fit reads: copies of the clock's last samples and the prior it pulls to."""

    x: np.ndarray  # one row of TERMS per step sample
    y: np.ndarray  # the samples' durations (s)
    prior: CostModel
    samples: int  # the clock's sample count when the window was taken


class Fit(NamedTuple):
    cost: CostModel
    error: float  # median |relative error| on the window's kept samples
    window: Window


class StepClock:
    """One executor's step times: the samples its steps give and the cost model fitted to
    them. Only the core's loop calls it."""

    def __init__(self, prior: CostModel | None = None) -> None:
        self.prior = prior or CostModel()
        self.cost = self.prior  # the current estimate: the prior until MIN_SAMPLES
        self.samples = 0  # step samples taken (all time)
        self.fits = 0
        self.fitted_at = 0  # `samples` when the last fit read its window
        self.fit_error = math.nan  # median |relative error| of the last fit on its window
        self._x = np.zeros((WINDOW, len(TERMS)))
        self._y = np.zeros(WINDOW)
        self._next_fit = MIN_SAMPLES
        self._last_time: float | None = None
        self._last_jobs: frozenset[str] = frozenset()
        self._prefill: dict[str, int] = {}  # job id -> tokens its next step prefills

    def set_prior(self, prior: CostModel) -> None:
        """A new configured cost model (reload): the samples stay, the pull changes."""
        self.prior = prior
        if self.fits:
            self.refit()
        else:
            self.cost = prior

    def started(self, job_id: str, prefill_tokens: int) -> None:
        """A dispatch's first output is on its way: its step prefilled these tokens."""
        self._prefill[job_id] = max(prefill_tokens, 0)

    def forget(self, job_id: str) -> None:
        self._prefill.pop(job_id, None)

    def idle(self) -> None:
        """The lane has no job left: the next interval includes idle time."""
        self._last_time, self._last_jobs = None, frozenset()
        self._prefill.clear()

    def step(self, time: float, jobs: Sequence[tuple[str, int, int]]) -> bool:
        """One Tokens event: (job id, its context before the step, tokens it got) for each
        job in it. True when a fit is due: the owner then fits `window()` (`fit`, here or
        in a thread) and hands the result to `adopt`, or calls `refit`."""
        ids = frozenset(job_id for job_id, _, _ in jobs)
        prefill = sum(self._prefill.pop(job_id, 0) for job_id in ids)
        last, self._last_time = self._last_time, time
        busy = not self._last_jobs.isdisjoint(ids)
        self._last_jobs = ids
        if last is None or not busy or time <= last or not jobs:
            return False
        steps = max(max(count for _, _, count in jobs), 1)
        context = sum(ctx for _, ctx, _ in jobs)
        row = self.samples % WINDOW
        self._x[row] = (1.0 if prefill else 0.0, prefill, steps, steps * len(jobs),
                        steps * context)
        self._y[row] = time - last
        self.samples += 1
        if self.samples < self._next_fit:
            return False
        self._next_fit = min(self.samples * 2, self.samples + REFIT_EVERY)
        return True

    def window(self) -> Window:
        n = min(self.samples, WINDOW)
        return Window(self._x[:n].copy(), self._y[:n].copy(), self.prior, self.samples)

    def adopt(self, result: Fit) -> bool:
        """A fit of an earlier window becomes the clock's estimate, unless the prior changed
        since (a reload refits at once: `set_prior`) or a later window's fit was adopted.
        True when adopted."""
        if result.window.prior is not self.prior or result.window.samples < self.fitted_at:
            return False
        self.cost, self.fit_error = result.cost, result.error
        self.fits += 1
        self.fitted_at = result.window.samples
        return True

    def refit(self) -> None:
        """Fit the current window here and now."""
        self.adopt(fit(self.window()))

    def decode_step_s(self, batch: int, context_tokens: float) -> float:
        """Predicted seconds of one decode step of `batch` sequences holding
        `context_tokens` in all."""
        return self.cost.step_s(0, batch, context_tokens)


def fit(window: Window) -> Fit:
    """The cost model fitted to a window. Reads nothing else: safe in a worker thread."""
    x, y = window.x, window.y
    n = len(y)
    prior = np.asarray(window.prior.vector())
    # Each term is solved for as a multiple u of its scale: the prior's coefficient
    # times how much slower (or faster) the engine is than the prior says overall, so
    # terms the traffic cannot tell apart keep the prior's ratio at the engine's speed;
    # a term the prior has at 0 is scaled by its typical share of a step instead.
    speed = float(np.median(y / np.maximum(x @ prior, 1e-12)))
    typical = float(np.median(y)) / np.maximum(np.abs(x).mean(axis=0), 1e-12)
    scale = np.where(prior > 0, prior * speed, typical)
    target = (prior > 0).astype(float)
    keep = np.ones(n, dtype=bool)
    for _ in range(_TRIM_PASSES):  # fit, drop outliers, fit again
        u = _solve(x[keep] * scale, y[keep], target)
        rel = (x * scale) @ u / y - 1.0
        centre = float(np.median(rel[keep]))
        spread = _MAD_SIGMA * float(np.median(np.abs(rel[keep] - centre)))
        inliers = np.abs(rel - centre) <= max(_TRIM_Z * spread, _MIN_TRIM)
        if inliers.sum() < MIN_SAMPLES or (inliers == keep).all():
            break
        keep = inliers
    # Least squares on relative error weighs a slow step less than a fast one (1 / y),
    # so with step times skewed to the slow side the fit runs fast: the tiny engine's
    # steps took 6 % more than it said. Scaled so that the steps it kept add up to the
    # time they took, the clock's seconds are the engine's on average too.
    fitted = (x[keep] * scale) @ u
    if fitted.sum() > 0:
        u = u * (y[keep].sum() / fitted.sum())
    return Fit(CostModel.from_vector(u * scale), float(np.median(np.abs(rel[keep]))), window)


def _solve(x: np.ndarray, y: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Non-negative u minimising sum((x u - y) / y)^2 + PRIOR_WEIGHT |u - target|^2.
    Bounded-variable least squares with a cap on its iterations, not scipy's nnls: this ran
    on the event loop, and one nnls call on a refit held the daemon's loop for 2.1 s (its
    stack, logged by daemon/http/loopwatch.py: docs/results/2026-11-29-three-draws-and-a-
    blocked-loop.md); the same optimum on random windows (relative difference 1e-13)."""
    pull = math.sqrt(PRIOR_WEIGHT)
    a = np.vstack([x / y[:, None], pull * np.eye(len(target))])
    b = np.concatenate([np.ones(len(y)), pull * target])
    solved = lsq_linear(a, b, bounds=(0.0, np.inf), method="bvls", max_iter=_SOLVE_ITERATIONS)
    return np.asarray(solved.x)


def pooled(clocks: Iterable[StepClock], prior: CostModel) -> CostModel:
    """One cost model for estimates that are not about one executor (the policies' own):
    the mean of the executors' fitted coefficients; the prior while none has fitted."""
    fitted = [clock.cost.vector() for clock in clocks if clock.fits]
    if not fitted:
        return prior
    return CostModel.from_vector(np.mean(np.asarray(fitted), axis=0))


class TypicalJob:
    """What arriving jobs' predicted service times are made of (an EWMA of their terms),
    so that the typical service time follows the clock at once instead of ~100 arrivals
    later. Seconds = CostModel.wall_s of the average job, which is linear in the terms."""

    def __init__(self, weight: float) -> None:
        self.weight = weight  # EWMA weight of one arrival
        self._terms: np.ndarray | None = None  # [prefill?, prefill, out, out x mean context]

    def observe(self, context_tokens: float, out_tokens: float) -> None:
        out = max(out_tokens, 0.0)
        mean_context = context_tokens + (out + 1) / 2
        terms = np.array([1.0 if context_tokens > 0 else 0.0, context_tokens, out,
                          out * mean_context])
        if self._terms is None:
            self._terms = terms
        else:
            self._terms += self.weight * (terms - self._terms)

    @property
    def prompt_tokens(self) -> float:
        """The typical arriving job's context to prefill (0 before any arrival)."""
        return 0.0 if self._terms is None else float(self._terms[1])

    @property
    def mean_context(self) -> float:
        """The typical job's mean context over its decode steps (tokens)."""
        if self._terms is None:
            return 0.0
        out, reads = self._terms[2], self._terms[3]
        return float(reads / out) if out > 0 else float(self._terms[1])

    def seconds(self, cost: CostModel, batch: int) -> float:
        """The typical job's service in a batch of `batch` (0 before any arrival)."""
        if self._terms is None:
            return 0.0
        first, prefill, out, reads = self._terms
        return float(cost.prefill_base_s * first + cost.prefill_per_token_s * prefill
                     + (cost.decode_base_s + cost.decode_per_seq_s * batch) * out
                     + cost.decode_per_context_token_s * batch * reads)
