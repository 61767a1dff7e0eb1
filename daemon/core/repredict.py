"""Re-prediction of running jobs' remaining length, batched and kept off the decision loop.

A policy asks for it at a checkpoint (ISRTF: every K tokens). The predictor is any async
callable; the real one runs its model in a thread pool, so the loop never blocks on it. One
batch is in flight at a time: requests that arrive meanwhile form the next batch. Results go
into the core's inbox as Predicted events (revised). A failed or slow batch keeps the old
predictions (counted in `failures`), it never fails a job.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from daemon.core.events import Event, Predicted
from daemon.core.job import Job

log = logging.getLogger(__name__)

# jobs -> predicted remaining output tokens, one per job, in order.
RemainingPredictor = Callable[[Sequence[Job]], Awaitable[Sequence[float]]]


class Repredictor:
    def __init__(self, inbox: asyncio.Queue[Event], predict: RemainingPredictor | None) -> None:
        self.predict = predict
        self.timeout_s = 1.0
        self.batches = 0
        self.jobs = 0
        self.failures = 0  # batches that raised or timed out
        self._inbox = inbox
        self._pending: dict[str, tuple[Job, int]] = {}  # job id -> (job, tokens at request)
        self._task: asyncio.Task[None] | None = None

    def request(self, job: Job) -> None:
        if self.predict is None:
            return
        self._pending[job.job_id] = (job, job.num_generated_tokens)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name="repredict")

    async def _drain(self) -> None:
        while self._pending:
            batch = [(job, n) for job, n in self._pending.values() if not job.is_done]
            self._pending.clear()
            if batch:
                await self._predict_batch(batch)

    async def _predict_batch(self, batch: list[tuple[Job, int]]) -> None:
        predict = self.predict
        if predict is None:
            return
        self.batches += 1
        try:
            async with asyncio.timeout(self.timeout_s):
                remaining = list(await predict([job for job, _ in batch]))
            if len(remaining) != len(batch):
                raise ValueError(f"{len(remaining)} predictions for {len(batch)} jobs")
        except Exception:  # a predictor problem costs accuracy, never a job
            self.failures += 1
            log.warning("re-prediction of %d jobs failed; keeping old predictions",
                        len(batch), exc_info=True)
            return
        for (job, tokens_then), left in zip(batch, remaining, strict=True):
            if not job.is_done:
                self.jobs += 1
                # Tokens generated while the predictor ran are part of `left`'s window.
                self._inbox.put_nowait(Predicted(job.job_id, tokens_then + max(float(left), 1.0),
                                                 revised=True))

    async def close(self) -> None:
        """Cancel the batch in flight (shutdown)."""
        self._pending.clear()
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
