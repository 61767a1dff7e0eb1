"""What crosses into and out of the core: events into its inbox, commands to executors.

Events go into the core's one inbox (an asyncio.Queue) and are handled in order by its loop
(daemon.core.scheduler): from the HTTP side (Submitted, Cancelled), the predictor
(Predicted), the executors (Started, Tokens, Stopped, EngineDown, EngineUp, Capacity,
EngineFailed), the daemon (Reconfigured) and the core's own clock fits (Refitted).
Commands go into one executor's queue (Launch, Stop, Shutdown). Executors report facts;
the core decides what they mean for the job.
"""

from __future__ import annotations

import msgspec

from daemon.core.clock import Fit
from daemon.core.job import Job, SamplingSpec, StopRequest
from daemon.core.policy import Policy
from daemon.core.settings import SchedulerConfig
from daemon.core.stream import OutputStream

# ---- events (into the core's inbox) ------------------------------------------------------


class Submitted(msgspec.Struct, frozen=True):
    """A new request, admitted by Scheduler.submit."""

    job: Job
    stream: OutputStream
    shed: str | None = None  # a waiting sheddable job to drop for this one's room


class Cancelled(msgspec.Struct, frozen=True):
    """The client went away, or shutdown: end the job wherever it is."""

    job_id: str


class Predicted(msgspec.Struct, frozen=True):
    """A predicted output length: the first one, or a re-prediction of a running job."""

    job_id: str
    total_tokens: float  # predicted total output tokens
    revised: bool = False  # a re-prediction (the first one stays the job's first_prediction)
    # The same at the predictor's upper quantile (memory admission); None: it has none.
    upper_tokens: float | None = None


class Started(msgspec.Struct, frozen=True):
    """A dispatch's first output: how much of its context the engine had cached."""

    executor: str
    job_id: str
    context_tokens: int  # prompt + tokens generated before this dispatch
    cached_tokens: int


class Tokens(msgspec.Struct, frozen=True):
    """One engine step's new tokens, for every job that got some."""

    executor: str
    time: float  # loop clock when the step's output arrived (s)
    items: list[tuple[str, list[int]]]  # (job id, token ids) in step order
    # What the engine said with this step's output, where it says (vLLM's scheduler
    # stats): the fraction of its KV blocks in use, and the requests queued inside it.
    kv_usage: float | None = None
    engine_waiting: int | None = None


class Stopped(msgspec.Struct, frozen=True):
    """A dispatch ended. The core classifies it (finished, yielded, aborted, failed)."""

    executor: str
    job_id: str
    finish_reason: str | None  # the engine's ("stop", "length", "abort"); None: cut early
    error: str | None = None  # the job failed in the engine (not the engine itself)
    kv_offloaded: bool = False  # its KV was saved to kvstore at the stop


class EngineDown(msgspec.Struct, frozen=True):
    """The executor's engine died or hung; its running jobs follow as Stopped events."""

    executor: str
    why: str


class EngineUp(msgspec.Struct, frozen=True):
    executor: str


class Capacity(msgspec.Struct, frozen=True):
    """What an executor's engine can hold, for memory-aware admission: reported when the
    executor's task starts and after each engine restart (before EngineUp)."""

    executor: str
    kv_blocks: int  # KV blocks requests can be given (the engine's, less any it reserves)
    block_size: int  # tokens per KV block
    max_num_seqs: int  # the engine's batch cap


class EngineFailed(msgspec.Struct, frozen=True):
    """The engine could not be restarted; the executor stays down for good."""

    executor: str
    why: str


class Reconfigured(msgspec.Struct, frozen=True):
    """A reloaded config: the core's new settings and policy."""

    settings: SchedulerConfig
    policy: Policy


class Refitted(msgspec.Struct, frozen=True):
    """A lane's clock fit, done in the core's worker thread (core/clock.py); None when the
    fit failed (logged)."""

    executor: str
    fit: Fit | None


Event = (Submitted | Cancelled | Predicted | Started | Tokens | Stopped | EngineDown | EngineUp
         | Capacity | EngineFailed | Reconfigured | Refitted)

# ---- commands (into one executor's queue) ------------------------------------------------


class Launch(msgspec.Struct, frozen=True, kw_only=True):
    """Start (or resume) a job: generate up to max_new_tokens after its context."""

    job_id: str
    dispatch: int  # 1 for the first launch, then one more per resume
    prompt_token_ids: list[int]
    generated_token_ids: list[int]  # output so far (a resume's context continues with it)
    sampling: SamplingSpec
    max_new_tokens: int
    engine_priority: int
    stream: OutputStream
    resume_offloaded: bool = False  # its KV was saved to kvstore at its last preemption
    true_output_tokens: int | None = None  # known to benchmarks only (the simulator's EOS)


class Stop(msgspec.Struct, frozen=True):
    """Stop a running job at its next token boundary."""

    job_id: str
    why: StopRequest
    offload: bool = False  # save its KV to kvstore first (a preemption, where there is one)


class Shutdown(msgspec.Struct, frozen=True):
    pass


Command = Launch | Stop | Shutdown
