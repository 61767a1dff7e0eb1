"""Blend: one knob between FCFS and SJF, a wait bound relative to each job, and preemption
only where it pays.

Order: a waiting job's key is its arrival time plus `beta` x its predicted service seconds
(`Policy.service_s`: prefill of its context, then its remaining decode steps in a full
batch, on the engine's learned clock). beta = 0 is FCFS; a large beta is SJF. A job of
service S can only be overtaken by jobs that arrived less than beta x S after it, so its
wait is FCFS's plus at most beta x its *own* service: the tail bound is in real seconds and
relative to the job (a 0.2 s answer waits at most ~beta x 0.2 s longer than under FCFS, a
2-minute report ~beta x 2 minutes). UniBoost ("Beyond Prediction", ICML 2026) slides one
parameter between FCFS and SJF the same way and finds a middle setting beats both on the
tail; SGLang's HRRN and vllm-ltr's starvation boost are the same idea as a ratio and a
counter. The key is fixed while the job waits (O(log n) per operation, unlike HRRN's scan).

The core's aging bound for this policy is that promise made hard: slowdown x the typical
service (what FCFS's own queueing gives anyone in a burst) plus beta x the job's own
service; a job past it is promoted (never preempted again) by the core, as for every policy.
Its deadlines sort like the keys, so promotion and the look-ahead guard agree with the order.

Preemption (TRAIL, "Don't Stop Me Now", 2024: preempt early in a job, never near its end):
a waiting job replaces the running job with the most predicted seconds left only if
  * that job is early: it has produced less than `early_fraction` of its predicted answer
    (its KV is small and little work is thrown away),
  * the candidate ranks before it as a waiting job would (its key, resume cost included),
  * its remaining seconds exceed (1 + margin) x (the candidate's service + its own resume
    cost: the re-prefill of prompt + generated tokens, or one token from kvstore),
and each job is preempted at most `max_preemptions` times. With `offload`, a victim whose
context is at least `offload_min_tokens` resumes from kvstore (its recompute would cost
more than the reload); shorter ones are left to the engine's prefix cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

from daemon.core.costmodel import CostModel
from daemon.core.job import Job, KVResidency
from daemon.core.policy import MS_RANK_SCALE, DispatchContext, Policy, class_rank
from policies.common import BENCH_KNOB, NonNegative, Params, pick_victim, true_remaining


class BlendParams(Params, frozen=True):
    """[policies.blend]: the FCFS-SJF blend (every field a benchmark knob)."""

    # Seconds of arrival one second of predicted service is worth: 0 = FCFS, large = SJF.
    beta: Annotated[float, NonNegative, BENCH_KNOB] = 4.0
    # Share of beta x the job's own service added to the core's uniform aging bound
    # (slowdown x typical service): 1 = the order's promise made hard, 0 = uniform only.
    bound_share: Annotated[float, NonNegative, BENCH_KNOB] = 1.0
    # Preempt at all (a waiting job replacing a running one, by the rules above).
    preempt: Annotated[bool, BENCH_KNOB] = True
    # A job may be preempted only before it has produced this share of its predicted answer.
    early_fraction: Annotated[float, NonNegative, BENCH_KNOB] = 0.25
    # Victim's remaining seconds must exceed (1 + margin) x (candidate's + resume cost).
    margin: Annotated[float, NonNegative, BENCH_KNOB] = 1.0
    # Most times one job may be preempted.
    max_preemptions: Annotated[int, NonNegative, BENCH_KNOB] = 1
    # Preempted jobs with at least offload_min_tokens of context go to kvstore (needs
    # [kvstore] enabled); the rest wait in the engine's prefix cache.
    offload: Annotated[bool, BENCH_KNOB] = False
    offload_min_tokens: Annotated[int, NonNegative, BENCH_KNOB] = 512
    # vLLM's own order among the jobs handed to it (its waiting queue, and the victim it
    # preempts when its KV runs out: the one it ranks last): "remaining", most predicted
    # tokens left last; "key", blend's key (arrival + beta x service), so that with
    # count-only admission (scheduler.max_running = a number: every job goes to the engine
    # at once) the engine itself keeps blend's bounded overtaking: a running job is pushed
    # out only by jobs that arrived less than beta x (its service - theirs) after it.
    engine_order: Annotated[Literal["remaining", "key"], BENCH_KNOB] = "remaining"


class Blend(Policy):
    name = "blend"
    preemptive = True
    params_type = BlendParams
    params_section = "blend"

    def __init__(self, params: BlendParams | None = None, cost: CostModel | None = None,
                 max_running: int = 4) -> None:
        super().__init__(params, cost, max_running)
        self.params = params or BlendParams()
        self.max_preemptions = self.params.max_preemptions  # the core reads it

    def order_key(self, job: Job) -> float:
        return job.arrival_time + self.params.beta * self.service_s(job)

    def own_wait_s(self, job: Job) -> float:
        return self.params.bound_share * self.params.beta * self.service_s(job)

    def engine_priority(self, job: Job) -> int:
        if self.params.engine_order == "key":
            return class_rank(job.priority, self.order_key(job) * 1000.0, MS_RANK_SCALE)
        # vLLM's own memory preemption then hits the job with the most tokens left.
        return class_rank(job.priority, self.remaining_tokens(job))

    # ---- preemption ---------------------------------------------------------------------

    def remaining_s(self, job: Job) -> float:
        """Seconds of decoding the job still needs in a full batch (no prefill)."""
        context = job.num_context_tokens
        return self.cost.wall_s(0, context, self.remaining_tokens(job), self.batch_hint)

    def resume_s(self, job: Job) -> float:
        """What stopping the job now costs its resume: the re-prefill of its context (one
        token when it would come back from kvstore)."""
        context = job.num_context_tokens
        return self.cost.prefill_s(1 if self._offloads(job) else context)

    def is_early(self, job: Job) -> bool:
        done = job.num_generated_tokens
        return done < self.params.early_fraction * (done + self.remaining_tokens(job))

    def choose_victim(self, candidate: Job, running: Sequence[Job], now: float) -> Job | None:
        if not self.params.preempt:
            return None
        early = [job for job in running if self.is_early(job)]
        return pick_victim(candidate, early, self.remaining_s, self._pays)

    def _pays(self, candidate: Job, victim: Job) -> bool:
        resume = self.resume_s(victim)
        if self.order_key(candidate) >= victim.arrival_time + self.params.beta * (
                self.remaining_s(victim) + resume):
            return False
        return self.remaining_s(victim) > (1.0 + self.params.margin) * (
            self.service_s(candidate) + resume)

    def preempt_residency(self, job: Job, ctx: DispatchContext) -> KVResidency:
        return KVResidency.OFFLOAD if self._offloads(job) else KVResidency.KEEP

    def _offloads(self, job: Job) -> bool:
        context = job.num_context_tokens
        return self.params.offload and context >= self.params.offload_min_tokens


class OracleBlend(Blend):
    """Blend on the true remaining length: what a perfect predictor gives it."""

    name = "oracle-blend"
    uses_predictions = False
    benchmark_only = True  # the truth is known to benchmarks only

    def remaining_tokens(self, job: Job) -> float:
        return true_remaining(job)
