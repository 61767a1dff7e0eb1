"""Output-length prediction for the daemon: off the event loop, micro-batched, never fatal.

The core asks for a job's first prediction with `request(job)`; the answer goes into the
core's inbox as a Predicted event. Re-predictions (`remaining`) are awaited by the core's
re-predictor (daemon.core.repredict), which posts their results the same way.

Two predictors, both loaded at start: `[predictor] path` makes each job's first estimate,
`[predictor] iterative_path` re-predicts running jobs' remaining length from prompt + the
text generated so far, when a policy asks at a checkpoint (ISRTF, ALISE).

One worker thread runs both (torch releases the GIL while it computes). Requests that
arrive while a batch runs form the next batch, up to `max_batch`. A first prediction that
fails or misses its deadline gives the job the fallback estimate (the running mean of
observed lengths) and counts in /metrics; no request waits longer than `timeout_s` for one.
A failed or late re-prediction keeps the job's previous estimate (daemon.core.repredict).

On SIGHUP each loaded predictor whose folder's files changed (a retrained model put in
place) is loaded anew in the worker thread and swapped in; one that fails to load or to
predict a probe is refused, and the running one is kept.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from daemon.config import PredictorConfig
from daemon.core.events import Event, Predicted
from daemon.core.job import Job, JobStatus
from daemon.requestlog import RequestLog

log = logging.getLogger(__name__)


@dataclass(slots=True)
class PredictionStats:
    """Counters read by /metrics at scrape time."""

    predictions: int = 0
    fallbacks: int = 0  # failed or timed-out predictions
    batches: int = 0
    observed: int = 0  # natural completions fed back (online index, fallback mean)
    reloads: int = 0  # predictors swapped for a changed model on SIGHUP
    reload_failures: int = 0  # changed models refused (the running one was kept)


class BatchTimer(Protocol):
    """Where the seconds of each predictor call go (daemon.http.metrics.Metrics)."""

    def observe_prediction_batch(self, seconds: float) -> None: ...

    def observe_repredict_batch(self, seconds: float) -> None: ...


@dataclass(slots=True)
class _Pending:
    inp: Any  # predictor.PredictInput
    future: asyncio.Future[tuple[float, float | None]]  # (point, upper quantile or None)


_PROBE = "Write a short poem about the sea."  # a request every model must answer


def _folder(path: str, iterative: bool) -> Path:
    from predictor import default_iterative_path, default_predictor_path

    if path:
        return Path(path)
    return default_iterative_path() if iterative else default_predictor_path()


class Predictions:
    def __init__(self, config: PredictorConfig, decode: Any, inbox: asyncio.Queue[Event],
                 timer: BatchTimer | None = None, upper_quantile: float = 0.9) -> None:
        """upper_quantile: the level of the upper estimate each first prediction comes
        with (memory admission, scheduler.admission_quantile), where the model has one."""
        self.config = config
        self.upper_quantile = upper_quantile
        self.stats = PredictionStats()
        self.predictor: Any = None  # predictor.Predictor once loaded; None = no prediction
        # Remaining-length model (predictor.Predictor); None = off: a running job's remaining
        # length is its first prediction minus the tokens it generated.
        self.iterative: Any = None
        self._inbox = inbox
        self._timer = timer
        self._requests: set[asyncio.Task[None]] = set()  # first predictions in flight
        self._decode = decode  # token ids -> text (the serving tokenizer)
        self._inputs: dict[str, Any] = {}  # job id -> PredictInput while the job lives
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="predictor")
        self._queue: list[_Pending] = []
        self._worker: asyncio.Task[None] | None = None
        self._saver: asyncio.Task[None] | None = None
        self._observed_total = 0.0
        self._log = RequestLog(config.request_log) if config.request_log else None
        self._fingerprints: dict[bool, str] = {}  # iterative? -> files of the loaded model
        self._reload_lock = asyncio.Lock()

    @property
    def fallback_tokens(self) -> float:
        if self.stats.observed:
            return self._observed_total / self.stats.observed
        return self.config.fallback_tokens

    async def load(self) -> None:
        loop = asyncio.get_running_loop()
        if self.config.iterative_path != "none":
            self.iterative = await loop.run_in_executor(self._pool, self._load,
                                                        self.config.iterative_path, True)
            log.info("remaining-length predictor %s (%s) loaded", self.iterative.kind,
                     self.iterative.path)
        if self.config.path == "none":
            log.info("predictor disabled: every job gets the fallback estimate")
            return
        self.predictor = await loop.run_in_executor(self._pool, self._load, self.config.path,
                                                    False)
        log.info("predictor %s (%s) loaded", self.predictor.kind, self.predictor.path)
        self._saver = asyncio.create_task(self._save_periodically(), name="predictor-save")

    async def _save_periodically(self) -> None:
        """Persist online state (the retrieval index) so a crash loses little of it."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.config.save_interval_s)
            try:
                await loop.run_in_executor(self._pool, self.predictor.save)
            except Exception:
                log.exception("saving the predictor's online state failed")

    def _load(self, path: str, iterative: bool) -> Any:
        import torch

        from predictor import PredictInput, load_predictor
        from predictor.loader import model_fingerprint

        torch.set_num_threads(self.config.threads)  # the engines need the other cores
        folder = _folder(path, iterative)
        fingerprint = model_fingerprint(folder)
        predictor = load_predictor(folder)
        if not iterative:  # warm: the first request must not pay for lazy initialisation
            probe = PredictInput.from_openai([{"role": "user", "content": _PROBE}])
            predictor.predict_with_upper([probe], self.upper_quantile)
        self._fingerprints[iterative] = fingerprint
        return predictor

    async def reload(self) -> None:
        """SIGHUP: reload each loaded predictor whose folder's files changed. A model that
        does not load, or does not give a finite length for a probe request, is refused: the
        running one stays, and the refusal is logged and counted."""
        async with self._reload_lock:
            loop = asyncio.get_running_loop()
            for iterative, current in ((False, self.predictor), (True, self.iterative)):
                if current is None:
                    continue
                path = self.config.iterative_path if iterative else self.config.path
                try:
                    new = await loop.run_in_executor(self._pool, self._reload_one, path,
                                                     iterative)
                except Exception as exc:  # noqa: BLE001 - any broken model is refused
                    self.stats.reload_failures += 1
                    log.error("predictor reload refused, keeping the running %s model (%s): %s",
                              current.kind, current.path, exc)
                    continue
                if new is None:
                    log.info("predictor %s unchanged; not reloaded", current.path)
                    continue
                if iterative:
                    self.iterative = new
                else:
                    self.predictor = new
                self.stats.reloads += 1
                log.info("predictor reloaded: %s (%s)", new.kind, new.path)

    def _reload_one(self, path: str, iterative: bool) -> Any:
        """In the worker thread: the new predictor, or None if the files did not change."""
        from predictor import PredictInput, load_predictor
        from predictor.loader import model_fingerprint

        folder = _folder(path, iterative)
        fingerprint = model_fingerprint(folder)
        if fingerprint == self._fingerprints.get(iterative):
            return None
        new = load_predictor(folder)
        probe = PredictInput.from_openai([{"role": "user", "content": _PROBE}])
        values = (new.predict_remaining([(probe, "")]) if iterative
                  else new.predict_with_upper([probe], self.upper_quantile)[0])  # and warms it
        if len(values) != 1 or not all(math.isfinite(v) and v >= 1.0 for v in values):
            raise ValueError(f"{folder}: probe prediction {values!r} is not a length")
        self._fingerprints[iterative] = fingerprint
        return new

    def request(self, job: Job) -> None:
        """The core asks for a new job's first prediction: it comes back as a Predicted
        event in the core's inbox (the fallback if anything goes wrong)."""
        task = asyncio.create_task(self._answer(job), name=f"predict:{job.job_id}")
        self._requests.add(task)
        task.add_done_callback(self._requests.discard)

    async def _answer(self, job: Job) -> None:
        point, upper = await self.predict_with_upper(job)
        self._inbox.put_nowait(Predicted(job.job_id, point, upper_tokens=upper))

    async def predict(self, job: Job) -> float:
        """Predicted total output tokens for a new job (from its messages, or its prompt's
        text); the fallback if anything goes wrong."""
        return (await self.predict_with_upper(job))[0]

    async def predict_with_upper(self, job: Job) -> tuple[float, float | None]:
        """predict's answer and the same at the upper quantile (None where the model has
        no quantile head, or the fallback was used)."""
        if self.predictor is None and self.iterative is None:
            return self.fallback_tokens, None
        from predictor import PredictInput

        messages = job.messages or [{"role": "user", "content": self._decode(
            job.prompt_token_ids)}]
        inp = PredictInput.from_openai(list(messages), job.num_prompt_tokens)
        self._inputs[job.job_id] = inp  # also the re-predictions' input
        if self.predictor is None:
            return self.fallback_tokens, None
        future: asyncio.Future[tuple[float, float | None]] = \
            asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(inp, future))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._run_batches(), name="predictor")
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.config.timeout_s)
        except Exception:  # noqa: BLE001 - timeout or predictor error: worse order, no lost job
            self.stats.fallbacks += 1
            return self.fallback_tokens, None

    async def _run_batches(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue:
            batch, self._queue = (self._queue[:self.config.max_batch],
                                  self._queue[self.config.max_batch:])
            started = time.perf_counter()
            try:
                values, uppers = await loop.run_in_executor(
                    self._pool, self.predictor.predict_with_upper, [p.inp for p in batch],
                    self.upper_quantile)
            except Exception as exc:  # noqa: BLE001 - reported to every waiter below
                log.warning("prediction of %d jobs failed: %s", len(batch), exc)
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(exc)
                continue
            self.stats.batches += 1
            if self._timer is not None:
                self._timer.observe_prediction_batch(time.perf_counter() - started)
            for i, (p, value) in enumerate(zip(batch, values, strict=True)):
                self.stats.predictions += 1
                upper = None if uppers is None else max(float(uppers[i]), 1.0)
                if not p.future.done():
                    p.future.set_result((max(float(value), 1.0), upper))

    async def remaining(self, jobs: Sequence[Job]) -> list[float]:
        """Re-predicted remaining tokens of running jobs (Scheduler.remaining_predictor).

        The input is prompt + the generated ids detokenized in the worker thread: the ids
        are at hand and exact after preemption and resume; streamed text would have to be
        kept per job. A job without a stored input keeps its current estimate, as every job
        does without a remaining-length model."""
        if self.iterative is None:
            return [job.predicted_remaining_tokens for job in jobs]
        batch = [(self._inputs.get(job.job_id), list(job.generated_token_ids),
                  job.predicted_remaining_tokens) for job in jobs]
        started = time.perf_counter()
        values = await asyncio.get_running_loop().run_in_executor(self._pool, self._remaining,
                                                                  batch)
        if self._timer is not None:
            self._timer.observe_repredict_batch(time.perf_counter() - started)
        return values

    def _remaining(self, batch: list[tuple[Any, list[int], float]]) -> list[float]:
        known = [i for i, (inp, _, _) in enumerate(batch) if inp is not None]
        out = [current for _, _, current in batch]
        step = self.config.max_batch
        for start in range(0, len(known), step):
            part = known[start:start + step]
            pairs = [(batch[i][0], self._decode(batch[i][1])) for i in part]
            for i, value in zip(part, self.iterative.predict_remaining(pairs), strict=True):
                out[i] = float(value)
        return out

    @property
    def num_tracked(self) -> int:
        """Jobs whose prediction input is kept until they end (re-prediction, feedback)."""
        return len(self._inputs)

    def job_ended(self, job: Job) -> None:
        """A job ended: feed a natural completion back, log the request."""
        inp = self._inputs.pop(job.job_id, None)
        if job.status != JobStatus.FINISHED or job.finish_reason != "stop":
            return  # cut by max_tokens or aborted: not the answer's true length
        self.stats.observed += 1
        self._observed_total += job.num_generated_tokens
        if inp is not None and (self.predictor is not None or self._log is not None):
            self._pool.submit(self._observe, inp, list(job.generated_token_ids), job.job_id)

    def _observe(self, inp: Any, ids: list[int], job_id: str) -> None:
        try:
            if self.predictor is not None:
                self.predictor.observe(inp, len(ids))
            if self._log is not None:
                self._log.append(job_id, inp.messages, self._decode(ids), len(ids))
        except Exception:
            log.exception("could not record the completion of %s", job_id)

    async def close(self) -> None:
        for task in (self._worker, self._saver, *self._requests):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        loop = asyncio.get_running_loop()
        if self.predictor is not None:
            await loop.run_in_executor(self._pool, self.predictor.save)
        if self._log is not None:
            await loop.run_in_executor(self._pool, self._log.close)
        self._pool.shutdown(wait=True)
