"""The wiring: config, tokenizer, executors, predictor, the scheduler core and its inbox,
built once; the tasks they run; what the HTTP layer reads.

Tasks: the core's loop, one per executor, and one that takes each ended job off the core's
ended-jobs queue to the predictor (feedback), the metrics and the Retry-After estimate.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec

from daemon import apikeys
from daemon.config import Config, ConfigError, SloConfig, cost_profile, slots_per_engine
from daemon.core.costmodel import CostModel
from daemon.core.events import Event
from daemon.core.forecast import Forecaster
from daemon.core.job import Job, SamplingSpec, Slo
from daemon.core.lanes import Lane
from daemon.core.scheduler import Scheduler
from daemon.core.stream import OutputStream
from daemon.executors import requestlimits
from daemon.executors.base import Executor
from daemon.http.metrics import Metrics
from daemon.policysetup import make_policy
from daemon.prediction import Predictions
from daemon.tokenizer import Tokenizer
from daemon.toolcalls import ToolParsing

log = logging.getLogger(__name__)

_RETRY_STARTING_S = 10  # Retry-After while engines start or restart (s)
_RETRY_MAX_S = 300  # never ask a client to wait longer than this (s)
_SERVICE_BEFORE_S = 1.0  # a job's service time before any arrived (Retry-After)
_STOP_TIMEOUT_S = 5.0  # executor tasks get this long to end at shutdown (s)


def model_context_len(config: Config) -> int:
    if config.model.max_model_len:
        return config.model.max_model_len
    model_cfg = json.loads((Path(config.model.path) / "config.json").read_text())
    return int(model_cfg.get("max_position_embeddings", 2048))


def config_sha256(config: Config) -> str:
    """The live tree's fingerprint: every key's value, defaults included (the file's text,
    comments and order do not count; restart-only sections a reload kept are the running
    ones)."""
    return hashlib.sha256(msgspec.json.encode(config)).hexdigest()


def build_executors(config: Config, inbox: asyncio.Queue[Event]) -> list[Executor]:
    engine = config.engine
    if engine.kind == "sim":
        from daemon.executors.sim import SimExecutor

        return [SimExecutor(f"sim{i}", inbox, cost_profile(config), engine)
                for i in range(len(engine.devices))]
    from daemon.executors.vllm import VLLMExecutor

    return [VLLMExecutor(f"{dev.replace(':', '')}-{i}", dev, config, inbox)
            for i, dev in enumerate(engine.devices)]


def adopt_slo(forecast: Forecaster, slo: SloConfig) -> None:
    """The [slo] section's admission settings, at start and on reload."""
    forecast.enforce = slo.enforce
    forecast.refuse_quantile = slo.refuse_quantile
    forecast.overload.after_late = slo.refuse_after_late
    forecast.overload.inflow = slo.refuse_inflow
    forecast.refuse_overshoot = slo.refuse_overshoot
    moved = (forecast.promote_slack, forecast.waiting.late_in_place) != (
        slo.promote_slack, slo.late == "in-place")
    forecast.promote_slack = slo.promote_slack
    forecast.waiting.late_in_place = slo.late == "in-place"
    if moved:  # the waiting jobs' promotions and places under the new settings
        forecast.waiting.refresh()


def build_core(config: Config, executors: Sequence[Executor], inbox: asyncio.Queue[Event],
               *, cost: CostModel | None = None, **ports: Any) -> Scheduler:
    """The scheduler core over `executors` (one lane each), with the config's policy and
    settings, its estimates in `cost` (default: the config's cost model); `ports`:
    Scheduler's predictor, remaining, ended and fits."""
    lanes = [Lane(ex.name, ex.commands, slots_per_engine(config)) for ex in executors]
    core = Scheduler(lanes, make_policy(config, cost=cost), config.scheduler, inbox, **ports)
    adopt_slo(core.forecast, config.slo)
    return core


def build_tool_parsing(config: Config, tokenizer: Tokenizer) -> ToolParsing | None:
    """vLLM's tool parser named by model.tool_call_parser (None: no parser, "auto" tool
    choice is refused). ConfigError for a name vLLM does not know or a parser whose tokens
    the model's tokenizer lacks."""
    if not config.model.tool_call_parser:
        return None
    from daemon.executors.vllm_tools import VLLMToolParsing

    try:
        return VLLMToolParsing(config.model.tool_call_parser, tokenizer.hf)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


class Service:
    def __init__(self, config: Config, tokenizer: Tokenizer) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.tool_parsing = build_tool_parsing(config, tokenizer)
        self.max_model_len = model_context_len(config)
        # vLLM's request limits (its environment variables), applied at the door
        self.request_limits = requestlimits.read()
        inbox: asyncio.Queue[Event] = asyncio.Queue()
        self.executors = build_executors(config, inbox)
        self.metrics = Metrics()
        self.predictions = Predictions(config.predictor, tokenizer.decode, inbox, self.metrics,
                                       config.scheduler.admission_quantile)
        self._ended: asyncio.Queue[Job] = asyncio.Queue()
        repredicts = config.predictor.iterative_path != "none"
        # the learned clock's fits: off the event loop (core/refits.py)
        self._fits = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clock-fit")
        self.scheduler = build_core(
            config, self.executors, inbox, predictor=self.predictions,
            remaining=self.predictions.remaining if repredicts else None, ended=self._ended,
            fits=self._fits)
        self.metrics.watch(self.scheduler, self.predictions, self.executors)
        self.metrics.config_live(config.scheduler.policy, config_sha256(config))
        self.keys = self._load_keys(config)
        self.ready = False
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    async def create(cls, config: Config) -> Service:
        tokenizer = await asyncio.to_thread(Tokenizer, config.model.path)
        return cls(config, tokenizer)

    @property
    def failed(self) -> asyncio.Event:
        """Set when no executor can be restarted: the daemon must exit so systemd restarts
        it."""
        return self.scheduler.failed

    async def start(self) -> None:
        """Start and warm every engine and load the predictor, then open for requests."""
        await asyncio.wait_for(asyncio.gather(self.predictions.load(),
                                              *(ex.start() for ex in self.executors)),
                               self.config.engine.startup_timeout_s)
        self._tasks = [asyncio.create_task(self.scheduler.run(), name="core"),
                       asyncio.create_task(self._observe_ended(), name="ended-jobs")]
        self._tasks += [asyncio.create_task(ex.run(), name=f"executor:{ex.name}")
                        for ex in self.executors]
        self.scheduler.accepting = True
        self.ready = True

    async def _observe_ended(self) -> None:
        while True:
            self._observe(await self._ended.get())
            self.observe_ended()

    def observe_ended(self) -> None:
        """Take in every job that ended and was not observed yet (also called before a
        /metrics scrape, so that it counts every job whose response has ended)."""
        while not self._ended.empty():
            self._observe(self._ended.get_nowait())

    def _observe(self, job: Job) -> None:
        try:
            self.predictions.job_ended(job)
            self.metrics.observe_job(job)
        except Exception:  # metrics or the request log must not stop the others
            log.exception("observing the end of %s failed", job.job_id)

    def new_job(self, prompt_token_ids: list[int], sampling: SamplingSpec, priority: int,
                prefix: str, messages: list[dict[str, str]] | None = None,
                slo: Slo | None = None) -> Job:
        return Job(job_id=f"{prefix}-{uuid.uuid4().hex}", prompt_token_ids=prompt_token_ids,
                   sampling=sampling, arrival_time=self.scheduler.now(), priority=priority,
                   messages=messages or [], slo=slo)

    def check_sampling(self, spec: SamplingSpec) -> None:
        """Raise ValueError (with `param` naming the field, where the engine says) when the
        engines would refuse `spec` (vLLM's own checks), before a job exists."""
        for executor in self.executors:
            executor.check_sampling(spec)

    def submit(self, job: Job) -> OutputStream:
        """Hand a new job to the core; its output comes on the stream returned. Refused at
        once with NotAccepting (503) or QueueFull (429)."""
        stream = OutputStream(job.sampling.stop, job.sampling.min_tokens,
                              job.sampling.include_stop_str_in_output)
        self.scheduler.submit(job, stream)
        return stream

    def retry_after_s(self) -> int:
        """Seconds a refused client should wait (Retry-After): the time the waiting queue
        needs to drain through the slots, at the typical job's service time on the
        engines' learned clock; the drain limit while stopping; a restart's worth while
        starting or without an engine."""
        if not self.ready or self.failed.is_set():
            return _RETRY_STARTING_S
        if not self.scheduler.accepting:
            return max(math.ceil(self.config.limits.drain_timeout_s), 1)
        sched = self.scheduler
        slots = sum(sched.estimates.slots(lane) for lane in sched.lanes
                    if lane.down_reason is None)
        if slots == 0:
            return _RETRY_STARTING_S
        service_s = sched.estimates.typical_service_s or _SERVICE_BEFORE_S
        wait = (len(sched.waiting) + 1) / slots * service_s
        return min(max(math.ceil(wait), 1), _RETRY_MAX_S)

    def executors_down(self) -> dict[str, str]:
        """Executor name -> why it is out of service, for /health."""
        return {ex.name: ex.down_reason for ex in self.executors if ex.down_reason is not None}

    def apply(self, config: Config) -> None:
        """Adopt a reloaded tree whose restart-only sections equal the running ones."""
        keys = self._load_keys(config)  # the file's contents change live; may raise
        self.scheduler.reconfigure(config.scheduler, make_policy(config))
        adopt_slo(self.scheduler.forecast, config.slo)  # read on the same loop
        self.keys = keys
        self.config = config
        self.metrics.config_live(config.scheduler.policy, config_sha256(config))

    @staticmethod
    def _load_keys(config: Config) -> apikeys.KeyRing | None:
        path = config.server.api_keys_file
        return apikeys.load(path) if path else None

    async def shutdown(self) -> None:
        self.ready = False
        await self.predictions.close()
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=_STOP_TIMEOUT_S)
        await asyncio.gather(*(ex.shutdown() for ex in self.executors), return_exceptions=True)
        self._fits.shutdown(wait=False, cancel_futures=True)
