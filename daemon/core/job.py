"""One request's state, from admission to its last token: plain data, written only by the
core's loop (daemon.core.scheduler); everything else reads it."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec

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


class StructuredSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A grammar the answer must follow (vLLM's StructuredOutputsParams): exactly one of
    json (a JSON schema, as JSON text), regex, choice, grammar, json_object, structural_tag."""

    json: str | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None


class SamplingSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What the engine needs to generate; crosses into the executors. The fields beyond
    max_tokens mean what vLLM's SamplingParams fields of the same name mean."""

    max_tokens: int  # output cap in tokens, already resolved against the context length
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1) = off
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    seed: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # over prompt and output tokens (a resume keeps it)
    logprobs: int | None = None  # top logprobs per output token (-1: whole vocabulary)
    logprob_token_ids: tuple[int, ...] | None = None  # logprobs of these ids instead
    prompt_logprobs: int | None = None  # per prompt token; the first dispatch only
    logit_bias: tuple[tuple[int, float], ...] = ()
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words: tuple[str, ...] = ()
    structured: StructuredSpec | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    thinking_token_budget: int | None = None
    repetition_detection: dict[str, int] | None = None  # vLLM's RepetitionDetectionParams
    watermarking: bool | None = None
    cache_salt: str | None = None  # salts the engine's prefix cache for this request
    # vLLM's extra_args (vllm_xargs, kv_transfer_params): for custom engine extensions.
    extra_args: dict[str, object] | None = None


class Slo(msgspec.Struct, frozen=True, kw_only=True):
    """A request's latency objective (llm-d's x-llm-d-slo-* headers, or its class's default):
    first token within ttft_s, then at most tpot_s per output token on average; None = no
    bound on that part. A sheddable job is dropped rather than served late, and first when a
    more urgent request needs its room in the queue."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    sheddable: bool = False


class Refusal(NamedTuple):
    """Why a request cannot meet its objective: which part, the predicted value (s), when a
    retry could (s from now), and which forecast of its wait said so."""

    reason: str  # "ttft" | "tpot"
    predicted_s: float
    retry_after_s: float
    # "queue": the slot forecast (the work ahead); "memory": the KV bound (its context
    # finding room); "none": no wait forecast (the time since arrival and the prefill)
    forecast: str = "none"
    wait_s: float = 0.0  # that forecast's wait from now (s), before the margin
    margin: float = 1.0  # the learned ratio (real / forecast wait) it was scaled by
    ahead: int = 0  # jobs forecast to start before it

    @property
    def cause(self) -> str:
        """"ttft:queue", "ttft:memory", "ttft:none" or "tpot": a metric label."""
        return f"ttft:{self.forecast}" if self.reason == "ttft" else self.reason

    def overshoot(self, objective: Slo) -> float:
        """The prediction over the objective it breaks (1.4: 40 % over)."""
        limit = objective.ttft_s if self.reason == "ttft" else objective.tpot_s
        return self.predicted_s / limit if limit else math.inf

    def explain(self) -> str:
        """The prediction and the forecast it came from, for a 429's message and the log."""
        if self.reason == "tpot":
            return f"predicted time per output token {self.predicted_s * 1000:.0f} ms"
        text = f"predicted time to first token {self.predicted_s * 1000:.0f} ms"
        if self.forecast == "none":
            return text
        jobs = "1 job" if self.ahead == 1 else f"{self.ahead} jobs"
        return (f"{text} ({self.forecast} forecast: a wait of {self.wait_s * 1000:.0f} ms "
                f"behind {jobs}, x margin {self.margin:.2f})")


@dataclass(slots=True, eq=False)
class Job:
    job_id: str
    prompt_token_ids: list[int]
    sampling: SamplingSpec
    arrival_time: float  # event-loop clock, seconds
    priority: int = 0  # request class, lower = more urgent (as vLLM)
    # The conversation as the client sent it ({"role", "content"}): what the length
    # predictor reads. Empty where there is none (tests, benchmarks).
    messages: list[dict[str, str]] = field(default_factory=list)
    # Predicted total output tokens (set before scheduling; None = no prediction).
    predicted_output_tokens: float | None = None
    # Predicted total output tokens at the predictor's upper quantile (memory admission:
    # daemon.core.admission); None where the predictor gives none.
    predicted_upper_tokens: float | None = None
    # The prediction as it stood at submit; re-predictions and demotions change only the
    # field above. None when the policy queued the job before predicting it.
    first_prediction: float | None = None
    # True output length, known only to benchmarks and oracle policies.
    true_output_tokens: int | None = None
    status: JobStatus = JobStatus.WAITING
    generated_token_ids: list[int] = field(default_factory=list)
    enqueue_time: float = 0.0  # when it last entered the waiting set
    waited_s: float = 0.0  # seconds waited in all earlier waits (preemptions, slices)
    # Bounded overtaking (aging.overtaking): later arrivals that started before it, and how
    # many may (set when it first arrives; None: no such bound). Reaching it promotes it.
    overtaken: int = 0
    overtake_budget: int | None = None
    # Where its time to first token went (lengthwise_ttft_phase_seconds): when it first
    # entered the waiting set (after its prediction, for policies that predict first) and
    # when it was first launched on an executor.
    first_enqueue_time: float | None = None
    first_launch_time: float | None = None
    launch_time: float = 0.0  # when its current (or last) dispatch was launched
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
    # The policy wants to look at a running job again when num_generated_tokens reaches
    # this (re-prediction windows, demotion on outliving a prediction); None = never.
    checkpoint_tokens: int | None = None
    # Policy estimates while waiting: seconds until it runs again, and where its KV waits.
    estimated_wait_s: float | None = None
    kv_residency: KVResidency | None = None
    # Its latency objective (None = best effort); crosses preemptions and engine restarts.
    slo: Slo | None = None
    # The core found it can no longer meet its objective: it waits on, in its place among the
    # on-time jobs or behind them as best effort ([slo] late).
    slo_missed: bool = False
    # The refusal admission would have made where it only counts them ([slo] enforce =
    # false, shadow mode); None: it would have been accepted.
    would_refuse: Refusal | None = None
    # Its last preemption saved its KV to kvstore (the executor said so when it stopped;
    # kv_residency may change later): the next resume counts as an offloaded one.
    kv_offloaded: bool = False

    @property
    def overtakes_spent(self) -> bool:
        """Overtaken as often as its budget allows: promoted (bounded overtaking)."""
        return self.overtake_budget is not None and self.overtaken >= self.overtake_budget

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_generated_tokens(self) -> int:
        return len(self.generated_token_ids)

    @property
    def num_context_tokens(self) -> int:
        """Prompt + generated: the KV the job holds while it runs."""
        return len(self.prompt_token_ids) + len(self.generated_token_ids)

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
        """Whether a preempted job's continuation equals an uninterrupted run's. Not for a
        seeded random sample (vLLM's per-request generator restarts from the seed when a
        job resumes), a grammar-constrained answer (the grammar would restart at the
        resume point), multi-token bad words (a word begun before the cut would be
        missed), repetition detection or a thinking budget (they count output tokens
        only). Such a job is never preempted nor sliced; see `resumable` for engine
        failures."""
        spec = self.sampling
        if spec.seed is not None and spec.temperature >= _GREEDY_TEMPERATURE:
            return False
        return (spec.structured is None and not spec.bad_words
                and spec.repetition_detection is None and spec.thinking_token_budget is None)

    @property
    def resumable(self) -> bool:
        """Whether the job can go on at all after its engine cut it (an engine failure):
        a grammar-constrained answer cannot (the grammar cannot start mid-answer), unless
        it has no output yet; others resume, exactly or as a different sample."""
        return self.sampling.structured is None or not self.generated_token_ids

    @property
    def on_time(self) -> bool:
        """It has a latency bound it can still meet: it waits ahead of best-effort jobs."""
        slo = self.slo
        return (slo is not None and not self.slo_missed
                and (slo.ttft_s is not None or slo.tpot_s is not None))

    @property
    def is_done(self) -> bool:
        return self.status >= JobStatus.FINISHED
