"""What the HTTP layer talks to: config, tokenizer, executors and the scheduler, wired once."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import uuid
from pathlib import Path

from daemon import apikeys
from daemon.config import Config, cost_profile
from daemon.core.job import Job, JobStatus, SamplingSpec
from daemon.core.scheduler import Scheduler
from daemon.executors.base import Executor
from daemon.executors.supervisor import Supervisor
from daemon.policysetup import make_policy
from daemon.prediction import Predictions
from daemon.tokenizer import Tokenizer

log = logging.getLogger(__name__)

_RETRY_STARTING_S = 10  # Retry-After while engines start or restart (s)
_RETRY_MAX_S = 300  # never ask a client to wait longer than this (s)
_SERVICE_EWMA = 0.1  # weight of each finished job in the service-time average


def model_context_len(config: Config) -> int:
    if config.model.max_model_len:
        return config.model.max_model_len
    model_cfg = json.loads((Path(config.model.path) / "config.json").read_text())
    return int(model_cfg.get("max_position_embeddings", 2048))


def build_executors(config: Config) -> list[Executor]:
    engine = config.engine
    if engine.kind == "sim":
        from daemon.executors.sim import SimExecutor

        return [SimExecutor(f"sim{i}", config.scheduler.max_running, cost_profile(config))
                for i in range(len(engine.devices))]
    from daemon.executors.vllm import VLLMExecutor

    return [VLLMExecutor(f"{dev.replace(':', '')}-{i}", dev, config)
            for i, dev in enumerate(engine.devices)]


class Service:
    def __init__(self, config: Config, tokenizer: Tokenizer, executors: list[Executor]) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.executors = executors
        self.max_model_len = model_context_len(config)
        self.scheduler = Scheduler(executors, make_policy(config),
                                   config.scheduler)
        self.predictions = Predictions(config.predictor, tokenizer.decode)
        self.scheduler.on_job_end.append(self.predictions.on_job_end)
        self.scheduler.on_job_end.append(self._observe_service)
        self._service_s = 1.0  # seconds a job runs once dispatched (EWMA of finished jobs)
        self.keys = self._load_keys(config)
        self.ready = False
        # Set when no executor can be restarted: the daemon must exit so systemd restarts it.
        self.failed = asyncio.Event()
        self.supervisors = [Supervisor(ex, config.engine, self._on_executor_failed)
                            for ex in executors]
        self._scheduler_task: asyncio.Task[None] | None = None
        self._supervisor_tasks: list[asyncio.Task[None]] = []

    @classmethod
    async def create(cls, config: Config) -> Service:
        tokenizer = await asyncio.to_thread(Tokenizer, config.model.path)
        return cls(config, tokenizer, build_executors(config))

    async def start(self) -> None:
        """Start and warm every engine and load the predictor, then open for requests."""
        await asyncio.wait_for(asyncio.gather(self.predictions.load(),
                                              *(ex.start() for ex in self.executors)),
                               self.config.engine.startup_timeout_s)
        if self.predictions.iterative is not None:
            self.scheduler.remaining_predictor = self.predictions.remaining
        self._scheduler_task = asyncio.create_task(self.scheduler.run(), name="scheduler")
        self._supervisor_tasks = [asyncio.create_task(sup.run(), name=f"supervise:{ex.name}")
                                  for sup, ex in zip(self.supervisors, self.executors,
                                                     strict=True)]
        self.scheduler.accepting = True
        self.ready = True

    def retry_after_s(self) -> int:
        """Seconds a refused client should wait (Retry-After): the time the waiting queue
        needs to drain at the observed service time per job; the drain limit while
        stopping; a restart's worth while starting or without an engine."""
        if not self.ready or self.failed.is_set():
            return _RETRY_STARTING_S
        if not self.scheduler.accepting:
            return max(math.ceil(self.config.limits.drain_timeout_s), 1)
        slots = sum(ex.max_running for ex in self.executors if ex.down_reason is None)
        if slots == 0:
            return _RETRY_STARTING_S
        wait = (len(self.scheduler.waiting) + 1) / slots * self._service_s
        return min(max(math.ceil(wait), 1), _RETRY_MAX_S)

    def _observe_service(self, job: Job) -> None:
        if job.finish_time is None or job.status is not JobStatus.FINISHED:
            return
        service_s = max(job.finish_time - job.arrival_time - job.waited_s, 0.0)
        self._service_s += _SERVICE_EWMA * (service_s - self._service_s)

    def executors_down(self) -> dict[str, str]:
        """Executor name -> why it is out of service, for /health."""
        return {ex.name: ex.down_reason for ex in self.executors if ex.down_reason is not None}

    def _on_executor_failed(self, executor: Executor, why: str) -> None:
        if all(sup.failed for sup in self.supervisors):
            self.scheduler.fail_waiting(f"no engine is available: {why}; the server restarts, "
                                        "retry shortly")
            self.failed.set()

    def new_job(self, prompt_token_ids: list[int], sampling: SamplingSpec, priority: int,
                prefix: str) -> Job:
        return Job(job_id=f"{prefix}-{uuid.uuid4().hex}", prompt_token_ids=prompt_token_ids,
                   sampling=sampling, arrival_time=self.scheduler.now(), priority=priority)

    def apply(self, config: Config) -> None:
        """Adopt a reloaded tree whose restart-only sections equal the running ones."""
        keys = self._load_keys(config)  # the file's contents change live; may raise
        self.scheduler.reconfigure(config.scheduler,
                                   make_policy(config))
        self.keys = keys
        self.config = config

    @staticmethod
    def _load_keys(config: Config) -> apikeys.KeyRing | None:
        path = config.server.api_keys_file
        return apikeys.load(path) if path else None

    async def shutdown(self) -> None:
        self.ready = False
        await self.predictions.close()
        tasks = [t for t in (self._scheduler_task, *self._supervisor_tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(ex.shutdown() for ex in self.executors), return_exceptions=True)
