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
"""

from __future__ import annotations

import collections
import math

LATE_HORIZON_S = 10.0  # a late job, or a refusal, counts as overload this long
_MAX_MARKS = 4096  # late jobs remembered (a safety cap: they leave after the horizon)


class Overload:
    def __init__(self) -> None:
        self.after_late = 0  # [slo] refuse_after_late; 0: always overloaded
        self._late: collections.deque[float] = collections.deque(maxlen=_MAX_MARKS)
        self._refused_at = -math.inf  # loop time of the latest refusal on a forecast

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
