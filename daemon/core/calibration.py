"""Online calibration of predicted output lengths to the served model.

The shipped predictors learned ShareGPT's answer lengths; the model behind the daemon answers
longer or shorter (SmolLM2 is terser than GPT-3.5, a benchmark may scale outputs). Ranking
does not care, but everything that turns a prediction into seconds does: aging's bounds, the
look-ahead guard's start estimates, wait estimates. Measured in the simulator
(docs/policies.md): with predictions 4x too long, the guard misjudges which deadlines are at
risk; on the right scale it holds p99 at FCFS's for a larger mean gain.

The scale is the geometric mean (an EWMA of log(actual / first prediction)) over jobs whose
true length is known (`Job.observed_output_tokens`: stopped by themselves, or forced to their
budget with ignore_eos); a job cut by its budget otherwise only says its length is at least
that, so it is not counted. Until `MIN_SAMPLES` jobs are seen the scale is 1.
"""

from __future__ import annotations

import math

from daemon.core.job import Job

WEIGHT = 0.02  # EWMA weight of one finished job: ~50 jobs of memory
MIN_SAMPLES = 20
_MAX_LOG = math.log(64.0)  # one wild miss moves the mean by at most WEIGHT x this


class LengthCalibration:
    def __init__(self) -> None:
        self.samples = 0
        self._log_mean = 0.0

    @property
    def scale(self) -> float:
        """Factor for predicted lengths (1.0 until enough jobs were seen)."""
        return math.exp(self._log_mean) if self.samples >= MIN_SAMPLES else 1.0

    def observe(self, job: Job) -> None:
        """A job ended: learn from it if it was predicted and its true length is known."""
        first = job.initial_prediction
        actual = job.observed_output_tokens
        if first is None or actual is None or actual <= 0:
            return
        ratio = math.log(actual / max(first, 1.0))
        ratio = min(max(ratio, -_MAX_LOG), _MAX_LOG)
        self._log_mean = ratio if self.samples == 0 else \
            self._log_mean + WEIGHT * (ratio - self._log_mean)
        self.samples += 1
