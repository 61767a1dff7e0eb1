"""The core's trace ([scheduler] trace, a benchmark knob): one JSON line for each admission
forecast of a request with a TTFT objective, each refusal on a forecast (the HTTP layer's
probe's too), each launch and each stop, so that the forecast can be replayed afterwards
with the service times that came true (`python -m bench.forecasterrors`,
docs/benchmarks.md "Where the forecast errs").

An admission line holds what the joint forecast (admission.seconds_until_started) read:
per lane the KV capacity and block size, the contexts held, each running job's predicted
seconds to its last token (with its context, tokens generated, the predictor's length and
the tokens left the forecast gave it: the policy's remaining tokens, calibrated, or an
oracle's truth), and the jobs ahead with their contexts and predicted services;
with the wait it forecast, whether that refused, and the job's latest start. A stop line
holds what the job generated against its prediction, its launch and first token. Times are
the core's loop clock (time.monotonic), comparable across the lines of one daemon.

Off (no path) it costs one test per event; on, a line per event, flushed as written (a
killed daemon leaves every line it wrote).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import IO, Any

import msgspec

from daemon.core.job import Job, Refusal
from daemon.core.lanes import Lane

log = logging.getLogger(__name__)
_encode = msgspec.json.Encoder().encode


class Trace:
    def __init__(self) -> None:
        self.path = ""
        self._file: IO[bytes] | None = None

    @property
    def on(self) -> bool:
        return self._file is not None

    def open(self, path: str) -> None:
        """Write to `path` from now on (appended to); "" stops. A new path on reload closes
        the old file; one that cannot be opened is logged and leaves the trace off (a
        benchmark's mistake must not stop the core)."""
        if path == self.path:
            return
        self.close()
        self.path = path
        if path:
            try:
                self._file = open(path, "ab", buffering=0)  # noqa: SIM115 (held while on)
            except OSError as exc:
                log.error("[scheduler] trace: cannot write %s (%s); no trace", path, exc)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(_encode(record) + b"\n")

    def admission(self, now: float, job: Job, wait: tuple[float, float],
                  ahead: Sequence[tuple[Job, float]], lanes: Sequence[Lane],
                  ends: Callable[[Lane], list[tuple[float, str]]], left: Callable[[Job], float],
                  step_s: float, refusal: Refusal | None, latest: float | None) -> None:
        """A forecast for `job` at admission: `wait` (queue, memory seconds), the jobs
        `ahead` with their predicted services, each lane's running jobs' predicted `ends`
        (seconds from now, job id) from the tokens `left` the forecast gave each, the decode
        step it grew them by."""
        self._write({
            "ev": "admit", "t": now, "id": job.job_id, "arrival": job.arrival_time,
            "context": job.num_context_tokens, "queue_s": wait[0], "memory_s": wait[1],
            "ahead": [[other.job_id, other.num_context_tokens, service]
                      for other, service in ahead],
            "step_s": step_s, "latest": latest,
            "refused": None if refusal is None else refusal.cause,
            "lanes": [{
                "name": lane.name, "kv_blocks": lane.capacity.kv_blocks,
                "block": lane.kv.block_size, "contexts": dict(lane.kv.contexts()),
                "slots": lane.max_running + lane.engine_spare, "ends": ends(lane),
                "running": {other.job_id: [other.num_context_tokens,
                                           other.num_generated_tokens,
                                           other.predicted_output_tokens, left(other)]
                            for other in lane.running.values()}}
                for lane in lanes if lane.capacity is not None and lane.down_reason is None]})

    def refused(self, now: float, job: Job, refusal: Refusal, probe: bool, late: int,
                inflow: float) -> None:
        """A refusal on a forecast (enforced or, in shadow mode, counted), `probe`: made
        before the prompt was tokenized (the HTTP layer's early test, where most are): how
        far over the objective the forecast put it, for refusal precision by overshoot, and
        the `late` jobs and the `inflow` (arrivals / ends) the overload gate read
        (overload.py)."""
        self._write({
            "ev": "refuse", "t": now, "id": job.job_id, "probe": probe, "late": late,
            "inflow": round(inflow, 3),
            "cause": refusal.cause, "predicted_s": refusal.predicted_s,
            "overshoot": None if job.slo is None else refusal.overshoot(job.slo),
            "wait_s": refusal.wait_s, "margin": refusal.margin, "ahead": refusal.ahead})

    def launch(self, now: float, job: Job, lane: Lane, waiting: int) -> None:
        self._write({"ev": "launch", "t": now, "id": job.job_id, "lane": lane.name,
                     "waiting": waiting, "running": len(lane.running)})

    def stop(self, now: float, job: Job, ended: bool) -> None:
        """The job stopped: `ended`, or back to wait (preempted, a slice)."""
        self._write({"ev": "stop", "t": now, "id": job.job_id, "ended": ended,
                     "generated": job.num_generated_tokens,
                     "predicted": job.predicted_output_tokens,
                     "launched": job.launch_time, "first": job.first_token_time})

