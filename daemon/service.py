"""What the HTTP layer talks to: config, tokenizer, executors and the scheduler, wired once."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from pathlib import Path

from daemon.config import Config
from daemon.core.job import Job, SamplingSpec
from daemon.core.scheduler import Scheduler
from daemon.executors.base import Executor
from daemon.executors.supervisor import Supervisor
from daemon.prediction import Predictions
from daemon.tokenizer import Tokenizer
from policies import registry

log = logging.getLogger(__name__)


def model_context_len(config: Config) -> int:
    if config.model.max_model_len:
        return config.model.max_model_len
    model_cfg = json.loads((Path(config.model.path) / "config.json").read_text())
    return int(model_cfg.get("max_position_embeddings", 2048))


def build_executors(config: Config) -> list[Executor]:
    engine = config.engine
    if engine.kind == "sim":
        from daemon.executors.sim import SimExecutor

        return [SimExecutor(f"sim{i}", config.scheduler.max_running, config.sim)
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
        self.scheduler = Scheduler(executors, registry.create(config.scheduler.policy, config),
                                   config.scheduler)
        self.predictions = Predictions(config.predictor, tokenizer.decode)
        self.scheduler.on_job_end.append(self.predictions.on_job_end)
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
        self.scheduler.reconfigure(config.scheduler,
                                   registry.create(config.scheduler.policy, config))
        self.config = config

    async def shutdown(self) -> None:
        self.ready = False
        await self.predictions.close()
        tasks = [t for t in (self._scheduler_task, *self._supervisor_tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(ex.shutdown() for ex in self.executors), return_exceptions=True)
