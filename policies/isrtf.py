"""ISRTF (ELIS, 2024): iterative shortest remaining time first.

Waiting jobs are ordered by predicted *remaining* tokens. While a job runs, its remaining
length is re-predicted every `window_tokens` (ELIS: 50) from prompt + partial output by the
iterative predictor (`Scheduler.remaining_predictor`, run off the loop); without one, the
remaining estimate is the first prediction minus what was generated.

ELIS re-batches every window (every job stops and is re-ranked every 50 tokens). Here jobs
keep running across windows and a waiting job preempts a running one only when it wins by a
margin: victim's remaining > (1 + margin) x candidate's remaining. A job is preempted at
most `max_preemptions` times (the core enforces it), which bounds churn and, with aging,
every job's completion time. Request classes come first (see policies.common.pick_victim).
With `offload`, a preempted job's KV is saved to kvstore at its abort and reloaded at its
resume (needs [kvstore] enabled; without it, or by default, the KV waits in the engine's
prefix cache until the engine needs the blocks). There is no estimated wait here, so every
victim is offloaded: a save costs a block copy (docs/kvstore.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import msgspec

from daemon.core.costmodel import CostModel
from daemon.core.job import Job, KVResidency
from daemon.core.policy import Checkpoint, DispatchContext, Policy, class_rank
from policies.common import BENCH_KNOB, NonNegative, Params, Positive, pick_victim, true_remaining


class ISRTFParams(Params, frozen=True):
    """[policies.isrtf]: iterative shortest remaining time first (ELIS), also oracle-srpt."""

    # Remaining length is re-predicted every this many generated tokens (ELIS's window).
    window_tokens: Annotated[int, msgspec.Meta(ge=1), BENCH_KNOB] = 50
    # A waiting job preempts a running one only if the victim's predicted remaining tokens
    # exceed (1 + margin) x the candidate's: preempt when it pays, not at every window.
    margin: Annotated[float, NonNegative, BENCH_KNOB] = 1.0
    # Most times one job may be preempted; bounds churn and every job's completion time.
    max_preemptions: Annotated[int, NonNegative, BENCH_KNOB] = 2
    # Seconds one batch of re-predictions may take before the old predictions are kept.
    repredict_timeout_s: Annotated[float, Positive, BENCH_KNOB] = 1.0
    # Preempted jobs' KV is saved to kvstore (needs [kvstore] enabled), not left in the
    # engine's prefix cache, where the engine may evict it (then the resume recomputes).
    offload: bool = False


class ISRTF(Policy):
    name = "isrtf"
    preemptive = True
    params_type = ISRTFParams
    params_section = "isrtf"

    def __init__(self, params: ISRTFParams | None = None, cost: CostModel | None = None,
                 max_running: int = 4) -> None:
        super().__init__(params, cost, max_running)
        params = params or ISRTFParams()
        self.window_tokens = params.window_tokens
        self.margin = params.margin
        self.max_preemptions = params.max_preemptions
        self.repredict_timeout_s = params.repredict_timeout_s
        self.offload = params.offload

    def order_key(self, job: Job) -> float:
        return self.remaining_tokens(job)

    def engine_priority(self, job: Job) -> int:
        return class_rank(job.priority, self.remaining_tokens(job))

    def next_checkpoint(self, job: Job) -> int | None:
        window = self.window_tokens
        return (job.num_generated_tokens // window + 1) * window

    def on_checkpoint(self, job: Job, now: float) -> Checkpoint:
        return Checkpoint(repredict=True)  # the remaining length from prompt + partial output

    def choose_victim(self, candidate: Job, running: Sequence[Job], now: float) -> Job | None:
        return pick_victim(candidate, running, self.remaining_tokens, self._pays)

    def preempt_residency(self, job: Job, ctx: DispatchContext) -> KVResidency:
        return KVResidency.OFFLOAD if self.offload else KVResidency.KEEP

    def _pays(self, candidate: Job, victim: Job) -> bool:
        bar = (1.0 + self.margin) * self.remaining_tokens(candidate)
        return self.remaining_tokens(victim) > bar


class OracleSRPT(ISRTF):
    """ISRTF's mechanism on the true remaining length: the bound on what prediction gives."""

    name = "oracle-srpt"
    uses_predictions = False
    benchmark_only = True  # the truth is known to benchmarks only

    def remaining_tokens(self, job: Job) -> float:
        return true_remaining(job)

    def next_checkpoint(self, job: Job) -> int | None:
        return None  # the truth needs no re-prediction
