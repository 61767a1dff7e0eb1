"""Whether the queue itself says overload, for admission under latency objectives.

A forecast of the queue refuses a request only in overload ([slo] refuse_after_late): once
`after_late` waiting jobs turned late (passed their latest start) in the last
LATE_HORIZON_S, or a refusal on a forecast came in that time. Refusals that work keep the
jobs accepted from turning late, so without the second the gate would close while an
overload goes on, and let a flood in. Below overload the requests a forecast would refuse
mostly make it: shadow mode beat enforcement at 0.4-0.8x in 7 of 9 draws and lost at 1.2x
and above in 6 of 6 (docs/results/2026-11-29-upper-backfill-and-4-slots.md); with the
gate, 8 draws met more requests' objectives at 1.0x in 6 of 6 with a third of the refusals
(docs/results/2026-11-29-refuse-after-late.md).

Late jobs also come at light load, from one burst or a slow hour of the engine, and a
refusal then is often wrong: vLLM's server served in time 7 of the 28 requests the default
refused at 0.65x on three draws. With [slo] refuse_inflow set (a benchmark knob, off), the
gate asks as well for the work to come in faster than it leaves: arrivals over ends in the
last INFLOW_WINDOW_S at least refuse_inflow, read at an arrival, and held LATE_HORIZON_S
once read (the refusals it makes count as arrivals that never end, so an overload it
refuses goes on reading as one). 1.25 on the same draws met fewer objectives at 0.65x
(0.91x), more at 1.0x (1.10x), and its refusals were no more precise: not adopted
(docs/results/2026-12-02-inflow-gate.md).
"""

from __future__ import annotations

import collections
import math

LATE_HORIZON_S = 10.0  # a late job, a refusal, or an inflow read counts this long
INFLOW_WINDOW_S = 30  # [slo] refuse_inflow: arrivals and ends counted over this long
INFLOW_MIN_ARRIVALS = 8  # fewer arrivals in the window read no inflow
_MAX_MARKS = 4096  # late jobs remembered (a safety cap: they leave after the horizon)


class _Counts:
    """Events in the last INFLOW_WINDOW_S, counted by whole seconds (bounded at any rate)."""

    def __init__(self) -> None:
        self._seconds: collections.deque[list[int]] = collections.deque()  # [second, count]
        self._total = 0

    def add(self, now: float) -> None:
        second = math.floor(now)
        if self._seconds and self._seconds[-1][0] == second:
            self._seconds[-1][1] += 1
        else:
            self._seconds.append([second, 1])
            self.count(now)  # the seconds out of the window leave, read or not
        self._total += 1

    def count(self, now: float) -> int:
        since = math.floor(now) - INFLOW_WINDOW_S
        while self._seconds and self._seconds[0][0] <= since:
            self._total -= self._seconds.popleft()[1]
        return self._total


class Overload:
    def __init__(self) -> None:
        self.after_late = 0  # [slo] refuse_after_late; 0: always overloaded
        self._late: collections.deque[float] = collections.deque(maxlen=_MAX_MARKS)
        self._refused_at = -math.inf  # loop time of the latest refusal on a forecast
        self.inflow = 0.0  # [slo] refuse_inflow; 0: the inflow is not asked
        self._arrived, self._ended = _Counts(), _Counts()
        self._inflow_at = -math.inf  # loop time of the latest arrival that read the inflow

    def turned_late(self, now: float) -> None:
        """A waiting job with an objective passed its latest start at `now`."""
        self._late.append(now)

    def refused(self, now: float) -> None:
        """A request was refused (or, in shadow mode, would have been) on a forecast."""
        self._refused_at = now

    def active(self, now: float) -> bool:
        """At least `after_late` late jobs, or a refusal, in the last LATE_HORIZON_S."""
        return self.late_jobs(now) >= self.after_late or self._refused_at >= now - LATE_HORIZON_S

    def late_jobs(self, now: float) -> int:
        """The waiting jobs that turned late in the last LATE_HORIZON_S."""
        late, since = self._late, now - LATE_HORIZON_S
        while late and late[0] < since:
            late.popleft()
        return len(late)

    def arrived(self, now: float) -> None:
        """A job arrived at admission, or a request was refused before it (a probe's)."""
        self._arrived.add(now)
        if (self.inflow and self._arrived.count(now) >= INFLOW_MIN_ARRIVALS
                and self.inflow_ratio(now) >= self.inflow):
            self._inflow_at = now

    def ended(self, now: float) -> None:
        """An accepted job ended (finished, failed, cancelled or shed)."""
        self._ended.add(now)

    def inflow_ratio(self, now: float) -> float:
        """Arrivals over ends in the last INFLOW_WINDOW_S (ends at least 1)."""
        return self._arrived.count(now) / max(self._ended.count(now), 1)

    def refusing(self, now: float) -> bool:
        """Whether a forecast may refuse: active(), and with refuse_inflow set, an arrival
        in the last LATE_HORIZON_S read an inflow of at least that."""
        return self.active(now) and (
            not self.inflow or self._inflow_at >= now - LATE_HORIZON_S)
