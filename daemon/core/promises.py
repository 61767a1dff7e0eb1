"""The starts admission promised and how they came true: the forecast's learned error.

Each job with a TTFT objective accepted in overload is promised a start some forecast wait
from its admission; when it starts (or turns late) its real wait over the forecast one is a
sample. The samples are kept apart for forecasts of the work ahead and of the memory bound
(they err apart), the last ERROR_WINDOW of the last ERROR_HORIZON_S; a job that ends
without starting, or is refused, leaves no sample. core/forecast.py refuses on a percentile
of them (margin) once there are MIN_ERRORS (learned).
"""

from __future__ import annotations

import collections

import numpy as np

ERROR_WINDOW = 256  # most recent start errors it reads
MIN_ERRORS = 8  # errors before they are used
COLD_RATIO = 1.0  # margin() shown before that (the forecast as it is); nothing is refused
RATIO_FLOOR_S = 0.1  # a forecast wait (but none) shorter than this counts as this
ERROR_HORIZON_S = 30.0  # errors older than this no longer count
_MAX_PROMISES = 4096  # promises kept (each leaves when its job starts or ends: a safety cap)


class Promises:
    def __init__(self) -> None:
        # job id -> (loop time of its admission, its forecast wait (s), whether the wait
        # was the memory bound's)
        self._promised: dict[str, tuple[float, float, bool]] = {}
        # (loop time, real / forecast wait) of the latest starts promised, by forecast:
        # of the work ahead (False) or of the memory bound (True)
        self._errors: dict[bool, collections.deque[tuple[float, float]]] = {
            memory: collections.deque(maxlen=ERROR_WINDOW) for memory in (False, True)}

    def promise(self, job_id: str, now: float, wait_s: float, memory: bool) -> None:
        """A job accepted at `now` to start `wait_s` from now, by that forecast."""
        self._promised[job_id] = (now, wait_s, memory)
        if len(self._promised) > _MAX_PROMISES:
            del self._promised[next(iter(self._promised))]  # the oldest

    def started(self, job_id: str, now: float) -> None:
        """A job promised a start started (or turned late) at `now`: a sample."""
        promised = self._promised.pop(job_id, None)
        if promised is None:
            return
        admitted, wait, memory = promised
        self.record(memory, now, (now - admitted) / max(wait, RATIO_FLOOR_S))

    def record(self, memory: bool, now: float, ratio: float) -> None:
        """A sample: a start that came `ratio` x its forecast wait, at `now`."""
        self._errors[memory].append((now, ratio))

    def forget(self, job_id: str) -> None:
        """A job ended without starting: its promise is no sample."""
        self._promised.pop(job_id, None)

    def ratios(self, memory: bool, now: float) -> list[float]:
        """The samples of that forecast in the last ERROR_HORIZON_S, oldest first."""
        errors = self._errors[memory]
        while errors and errors[0][0] < now - ERROR_HORIZON_S:
            errors.popleft()
        return [ratio for _, ratio in errors]

    def learned(self, memory: bool, now: float) -> bool:
        """At least MIN_ERRORS samples of that forecast in the last ERROR_HORIZON_S."""
        return len(self.ratios(memory, now)) >= MIN_ERRORS

    def margin(self, memory: bool, now: float, quantile: float) -> float:
        """The `quantile` percentile of those samples; COLD_RATIO before they are learned."""
        ratios = self.ratios(memory, now)
        if len(ratios) < MIN_ERRORS:
            return COLD_RATIO
        return float(np.percentile(ratios, quantile))
