"""One request's state, from admission to its last token."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from daemon.core import stopstrings

# vLLM samples greedily below this temperature (its _SAMPLING_EPS).
_GREEDY_TEMPERATURE = 1e-5


class JobStatus(enum.IntEnum):
    """Ordered: a job only moves to a higher value, except RUNNING -> WAITING on preemption."""

    WAITING = 1
    RUNNING = 2
    FINISHED = 3
    ABORTED = 4
    FAILED = 5


class StopRequest(enum.IntEnum):
    """Why the core asked an executor to stop a running job at the next token boundary."""

    PREEMPT = 1  # back to the waiting set, keeps its tokens
    ABORT = 2  # client went away or shutdown: the job ends


class KVResidency(enum.IntEnum):
    """Where a preempted job's KV cache should wait for its resume (advice to the executors)."""

    KEEP = 1  # stay cached on the engine (prefix cache): resume skips recomputation
    OFFLOAD = 2  # copy to kvstore (CPU memory)
    DROP = 3  # let the engine evict it: resume recomputes prompt + generated tokens


class SamplingSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What the engine needs to generate; crosses into the executors."""

    max_tokens: int  # output cap in tokens, already resolved against the context length
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


class TokenDelta(msgspec.Struct, frozen=True):
    """New output since the last delta; one or more tokens."""

    text: str
    token_ids: list[int]


class JobEnd(msgspec.Struct, frozen=True):
    """The last item on a job's output queue."""

    finish_reason: str | None  # "stop" | "length" | "abort" | None on error
    error: str | None = None


@dataclass(slots=True, eq=False)
class Job:
    job_id: str
    prompt_token_ids: list[int]
    sampling: SamplingSpec
    arrival_time: float  # event-loop clock, seconds
    priority: int = 0  # request class, lower = more urgent (as vLLM)
    # Predicted total output tokens (set before scheduling; None = no prediction).
    predicted_output_tokens: float | None = None
    # The prediction as it stood at submit; re-predictions and demotions change only the
    # field above. None when the policy queued the job before predicting it.
    first_prediction: float | None = None
    # True output length, known only to benchmarks and oracle policies.
    true_output_tokens: int | None = None
    status: JobStatus = JobStatus.WAITING
    generated_token_ids: list[int] = field(default_factory=list)
    enqueue_time: float = 0.0  # when it last entered the waiting set
    waited_s: float = 0.0  # seconds waited in all earlier waits (preemptions, slices)
    first_token_time: float | None = None
    finish_time: float | None = None
    finish_reason: str | None = None
    executor_name: str | None = None
    num_dispatches: int = 0
    tokens_at_dispatch: int = 0  # num_generated_tokens when the current dispatch began
    num_preemptions: int = 0
    # Launched after reaching its wait bound (aging): runs to the end, never preempted.
    promoted: bool = False
    stop_request: StopRequest | None = None
    # The core asks to hear about a running job when num_generated_tokens reaches this
    # (re-prediction windows, demotion on outliving a prediction); None = never.
    checkpoint_tokens: int | None = None
    on_checkpoint: Callable[[Job], None] | None = None
    # Policy estimates while waiting: seconds until it runs again, and where its KV waits.
    estimated_wait_s: float | None = None
    kv_residency: KVResidency | None = None
    # Its last preemption saved its KV to kvstore (set by the executor when it asks for the
    # save; kv_residency may change later): the next resume counts as an offloaded one.
    kv_offloaded: bool = False
    # Generated text not yet released: it may be the start of a stop string (stopstrings).
    held_text: str = ""
    outputs: asyncio.Queue[TokenDelta | JobEnd] = field(default_factory=asyncio.Queue)
    # Set by the executor running the job: called whenever what the job's predicted work
    # depends on changes (a delta in emit, a new prediction in set_prediction), to keep its
    # running total (daemon.core.work) in step.
    on_work_change: Callable[[Job], None] | None = None

    def set_prediction(self, tokens: float | None) -> None:
        """Replace the predicted output length (a late first estimate, a re-prediction, a
        demotion); the executor running the job updates its total."""
        self.predicted_output_tokens = tokens
        if self.on_work_change is not None:
            self.on_work_change(self)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_generated_tokens(self) -> int:
        return len(self.generated_token_ids)

    @property
    def num_remaining_budget_tokens(self) -> int:
        """Tokens the job may still generate under its max_tokens."""
        return self.sampling.max_tokens - self.num_generated_tokens

    @property
    def initial_prediction(self) -> float | None:
        """The first prediction: as it stood at submit, else (a job queued before its
        prediction, whose policy never revises it) the current one."""
        if self.first_prediction is not None:
            return self.first_prediction
        return self.predicted_output_tokens

    @property
    def observed_output_tokens(self) -> int | None:
        """The answer's true length, when this job's end reveals it; None when censored.

        Known: the job stopped by itself ("stop"), or it ran with ignore_eos until its
        max_tokens budget ran out (a forced length, as benchmarks replay traces: the budget is
        the truth). Censored: cut by its budget without ignore_eos (the answer is at least that
        long), aborted, failed, or not ended. The one rule for everything that compares a
        prediction with the truth (the prediction-error metric, length calibration)."""
        if self.status != JobStatus.FINISHED:
            return None
        if self.finish_reason == "stop":
            return self.num_generated_tokens
        if (self.finish_reason == "length" and self.sampling.ignore_eos
                and self.num_remaining_budget_tokens <= 0):
            return self.num_generated_tokens
        return None

    @property
    def predicted_remaining_tokens(self) -> float:
        """Predicted tokens still to come; the budget when there is no prediction."""
        return self.predicted_remaining(1.0)

    def predicted_remaining(self, scale: float, budget_caps: bool = True) -> float:
        """Predicted tokens still to come with the prediction scaled by `scale` (the
        core's calibration to the served model), at least 1, and at most the budget left
        unless `budget_caps` is off (benchmarks that force lengths through max_tokens)."""
        if self.predicted_output_tokens is None:
            return float(self.num_remaining_budget_tokens)
        left = max(self.predicted_output_tokens * scale - self.num_generated_tokens, 1.0)
        return float(min(left, self.num_remaining_budget_tokens) if budget_caps else left)

    @property
    def resumes_exactly(self) -> bool:
        """False for a seeded random sample: vLLM's per-request generator restarts from the
        seed when a job resumes, so the continuation would differ from an uninterrupted
        run's. Such a job is never preempted nor sliced (an engine failure still cuts it)."""
        return self.sampling.seed is None or self.sampling.temperature < _GREEDY_TEMPERATURE

    @property
    def is_done(self) -> bool:
        return self.status >= JobStatus.FINISHED

    def emit(self, text: str, token_ids: list[int], now: float) -> bool:
        """Executors call this for every delta, in order. True: a stop string was found, the
        job is finished ("stop") and the executor must stop generating."""
        if not token_ids and not text:
            return False
        if self.first_token_time is None:
            self.first_token_time = now
        self.generated_token_ids.extend(token_ids)
        if self.on_work_change is not None:
            self.on_work_change(self)
        spec = self.sampling
        found = stopstrings.scan(self.held_text, text, spec.stop,
                                 self.num_generated_tokens > spec.min_tokens)
        self.held_text = found.held
        self.outputs.put_nowait(TokenDelta(found.release, list(token_ids)))
        mark = self.checkpoint_tokens
        if mark is not None and len(self.generated_token_ids) >= mark:
            self.checkpoint_tokens = None  # one call per mark; the listener sets the next
            if self.on_checkpoint is not None:
                self.on_checkpoint(self)
        return found.stopped

    def end(self, status: JobStatus, now: float, finish_reason: str | None,
            error: str | None = None) -> None:
        if self.is_done:
            return
        self.status = status
        self.finish_time = now
        self.finish_reason = finish_reason
        if self.held_text:  # no stop string came: what was held back is output after all
            self.outputs.put_nowait(TokenDelta(self.held_text, []))
            self.held_text = ""
        self.outputs.put_nowait(JobEnd(finish_reason, error))
