"""What the core knows about time and memory, from what it has seen: each engine's learned
step times (lanes' clocks, pooled into the policy's cost model), the typical service time
of arriving jobs (aging's unit), the factor between predicted and actual answer lengths
(calibration) and each job's predicted KV footprint (admission).

The policy's `cost` is replaced by the pooled clock whenever a lane refits, so every policy
estimate (ALISE's times, SCLS's batches, placement, service times) follows the engines, and
`batch_hint` follows what memory admission lets run together. When the typical service
time, as the clock (not the arrivals) moves it, changes by more than REKEY_FACTOR since
the waiting set's deadlines were keyed, the core re-keys them (a clock that converged from a
prior 4x off would otherwise leave every waiting job's bound 4x off).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from daemon.core import clock
from daemon.core.admission import Footprints
from daemon.core.calibration import LengthCalibration
from daemon.core.costmodel import CostModel
from daemon.core.job import Job
from daemon.core.lanes import Lane
from daemon.core.policy import Policy
from daemon.core.settings import SchedulerConfig
from daemon.core.waitqueue import WaitBound

TYPICAL_WEIGHT = 0.01  # EWMA weight of one arrival: ~100 jobs of memory
REKEY_FACTOR = 1.25  # typical service time change that re-keys waiting jobs' deadlines
_FOOTPRINT_WEIGHT = 0.05  # EWMA weight of one launch's KV footprint (slot estimate)


class Estimates:
    def __init__(self, lanes: Sequence[Lane], policy: Policy, config: SchedulerConfig) -> None:
        self.lanes = lanes
        self.policy = policy
        self.config = config
        self.prior = policy.cost  # the configured cost model: where every clock starts
        self.calibration = LengthCalibration()
        self.footprints = Footprints(config.admission_quantile, config.upper_factor)
        self.typical = clock.TypicalJob(TYPICAL_WEIGHT)
        # The cost model and batch the waiting set's deadlines were last keyed with.
        self._keyed: tuple[CostModel, int] | None = None
        self._typical_footprint = 0.0  # EWMA of launched jobs' KV footprints (tokens)
        self.adopt(policy, config)

    def adopt(self, policy: Policy, config: SchedulerConfig) -> None:
        """Settings and a policy (at start, on reload): the lanes admit by them, the policy
        estimates with the learned clock; a new configured cost model becomes the clocks'
        prior."""
        for lane in self.lanes:
            lane.set_capacity(None, config.fixed_running)
            lane.spare = config.engine_queue
            lane.work_conserving = config.admission != "peak"
            lane.prices_overcommit = config.admission == "work-conserving"
            lane.engine_kv = config.engine_kv
            lane.backfill_by_room = config.admission == "now" and config.backfill_room
        if policy.cost is not self.policy.cost or policy is self.policy:
            self.prior = policy.cost
            for lane in self.lanes:
                lane.clock.set_prior(self.prior)
        policy.engine_order = config.engine_order
        self.policy, self.config = policy, config
        self.footprints.quantile = config.admission_quantile
        self.footprints.upper_factor = config.upper_factor
        policy.length_scale = self.calibration.scale if config.calibrate_lengths else 1.0
        policy.trust_budget = config.trust_budget
        self.refresh()

    def refresh(self) -> None:
        """The policy's cost model and batch from the lanes as they are now."""
        policy = self.policy
        policy.cost = (clock.pooled((lane.clock for lane in self.lanes), self.prior)
                       if self.config.learn_clock else self.prior)
        policy.batch_hint = self.batch_hint()

    # ---- time -----------------------------------------------------------------------------

    @property
    def typical_service_s(self) -> float:
        """Typical predicted service time of arriving jobs (s) under the current clock; 0
        before any arrival."""
        return self.typical.seconds(self.policy.cost, self.policy.batch_hint)

    def observe_arrival(self, job: Job) -> None:
        context = job.num_context_tokens
        self.typical.observe(context, self.policy.remaining_tokens(job))

    def wait_bound(self) -> WaitBound | None:
        """Seconds of total wait each job may accumulate: slowdown x the typical predicted
        service time of arriving jobs, within [min_wait_s, promote_after_s] (AgingConfig);
        with aging.overtaking only promote_after_s, the backstop: the bound is in places
        (Forecaster.stamp_overtake_budget, WaitQueue.overtaken). In seconds, a queue longer
        than slowdown x the typical service (any overload) promotes every job, and promoted
        jobs go earliest deadline first: the policy's order becomes FCFS's exactly where it
        matters most.

        Measured in the simulator (docs/policies.md): a bound proportional to each job's
        *own* service time loses to one uniform across jobs on both mean and p99, since
        the tail is made of waits in bursts, not of long service; the uniform bound still
        scales with the workload (seconds for chat answers, minutes for long reports).
        A policy may add a share of its own (Policy.own_wait_s: blend's beta x the job's
        own service), which its order already promises."""
        aging, policy = self.config.aging, self.policy
        self._keyed = (policy.cost, policy.batch_hint)
        if not (aging.enabled and policy.aged):
            return None
        low, high, k = aging.min_wait_s, aging.promote_after_s, aging.slowdown
        if k <= 0 or aging.overtaking:  # overtaking bounds by position (WaitQueue)
            return lambda _: high

        def bound(job: Job) -> float:
            typical = self.typical_service_s or self.policy.service_s(job)
            return min(high, max(low, k * typical + policy.own_wait_s(job)))

        return bound

    def clock_moved(self) -> bool:
        """A lane refitted: the policy estimates with the new clock. True when that moved
        the typical service time by more than REKEY_FACTOR since the deadlines were keyed
        (arrivals move it too, slowly: not counted here, as before there was a clock)."""
        self.refresh()
        if self._keyed is None:
            return False
        now = self.typical.seconds(self.policy.cost, self.policy.batch_hint)
        then = self.typical.seconds(*self._keyed)
        return now > 0 and then > 0 and abs(math.log(now / then)) > math.log(REKEY_FACTOR)

    # ---- lengths and memory ---------------------------------------------------------------

    def job_ended(self, job: Job) -> None:
        self.footprints.observe(job)
        if self.config.calibrate_lengths:
            self.calibration.observe(job)
            self.policy.length_scale = self.calibration.scale

    def footprint(self, job: Job) -> float:
        """The job's predicted KV footprint (tokens): core/admission.py."""
        return self.footprints.tokens(job, self.policy.length_scale, self.config.trust_budget)

    def left_tokens(self, job: Job) -> float:
        """Output tokens a running job may still generate, for forecasts of when it ends:
        its predicted rest; once it has run past its prediction (the rest is its last
        token), the mean rest of the recent answers longer than it is now (a job the
        predictor underestimated is not about to end; Footprints.residual), within its
        budget where budgets are trusted."""
        left = self.policy.remaining_tokens(job)
        if left > 1.0:
            return left
        residual = self.footprints.residual(job.num_generated_tokens)
        if residual is None:
            return left
        if self.config.trust_budget:
            residual = min(residual, job.num_remaining_budget_tokens)
        return max(residual, left)

    def launched(self, kv_tokens: float) -> None:
        if self._typical_footprint <= 0:
            self._typical_footprint = kv_tokens
        else:
            self._typical_footprint += _FOOTPRINT_WEIGHT * (kv_tokens - self._typical_footprint)

    @property
    def typical_footprint(self) -> float:
        """The recent launches' mean KV footprint (tokens); 0 before any launch."""
        return self._typical_footprint

    def slots(self, lane: Lane) -> int:
        """Jobs the lane runs together at load: its count cap, or under memory admission
        as many typical footprints as its KV cache holds (at most its count cap)."""
        cap = lane.capacity
        if not lane.memory_bound or cap is None or self._typical_footprint <= 0:
            return lane.max_running
        fit = cap.kv_blocks // lane.kv.blocks_for(self._typical_footprint)
        return max(min(fit, lane.max_running), 1)

    def batch_hint(self) -> int:
        """Jobs decoding together at load on a lane (the mean over serving lanes)."""
        slots = [self.slots(lane) for lane in self.lanes if not lane.failed]
        return max(round(sum(slots) / len(slots)), 1) if slots else 1
