"""Latency objectives at the door: a request's objective from llm-d's headers, its API key or
its class's default ([slo] classes); the 429s of requests refused or dropped to keep
objectives, with llm-d's reason header; the predicted latency a response reports.

Precedence, field by field: the request's x-llm-d-slo-ttft-ms / x-llm-d-slo-tpot-ms headers,
then its API key's objective, then its class's (by `priority`). `sheddable` comes from the
key or the class. No bound and not sheddable: best effort (no objective).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from daemon.apikeys import MAX_OBJECTIVE_MS, ApiKey, Objective
from daemon.core.job import Slo
from daemon.core.ports import SloUnreachable
from daemon.core.slo import Prediction
from daemon.core.stream import JobEnd
from daemon.http.errors import ApiError

TTFT_HEADER = "x-llm-d-slo-ttft-ms"
TPOT_HEADER = "x-llm-d-slo-tpot-ms"
DROPPED_HEADER = "x-llm-d-request-dropped-reason"
SATURATED = "rejected-saturated"  # llm-d's reason for a request refused for capacity


def objective(headers: Mapping[str, str], priority: int, key: ApiKey | None,
              classes: Mapping[str, Objective]) -> Slo | None:
    """The request's latency objective; None = best effort. A bad header is a 400 naming it."""
    base = key.objective if key is not None and key.objective is not None else (
        classes.get(str(priority)))
    ttft, tpot = _millis(headers, TTFT_HEADER), _millis(headers, TPOT_HEADER)
    if base is not None:
        ttft = base.ttft_ms if ttft is None else ttft
        tpot = base.tpot_ms if tpot is None else tpot
    sheddable = base is not None and base.sheddable
    if ttft is None and tpot is None and not sheddable:
        return None
    return Slo(ttft_s=None if ttft is None else ttft / 1000,
               tpot_s=None if tpot is None else tpot / 1000, sheddable=sheddable)


def _millis(headers: Mapping[str, str], name: str) -> float | None:
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_OBJECTIVE_MS:  # NaN fails too
        raise ApiError(400, f"header {name} must be milliseconds in (0, {MAX_OBJECTIVE_MS:.0f}]"
                            f", got {raw[:32]!r}", param=name)
    return value


def refused(exc: SloUnreachable) -> ApiError:
    """429 for a request that cannot meet its objective, before any engine work."""
    r = exc.refusal
    part = "time to first token" if r.reason == "ttft" else "time per output token"
    err = ApiError(429, f"cannot meet the request's latency objective: predicted {part} "
                        f"{r.predicted_s * 1000:.0f} ms; retry later", "rate_limit_error",
                   code="slo_unreachable", retry_after_s=max(math.ceil(r.retry_after_s), 1))
    err.headers[DROPPED_HEADER] = SATURATED
    return err


def dropped(end: JobEnd, retry_after_s: int) -> ApiError:
    """429 for an accepted request the core shed (JobEnd.dropped says why, llm-d's words)."""
    err = ApiError(429, end.error or "request dropped", "rate_limit_error", code="shed",
                   retry_after_s=retry_after_s)
    err.headers[DROPPED_HEADER] = end.dropped or SATURATED
    return err


def latency_headers(prediction: Prediction) -> dict[str, str]:
    """The predicted TTFT and finish (ms from arrival), for the response's headers; none
    while no engine serves (no finite forecast)."""
    if not math.isfinite(prediction.finish_s):
        return {}
    return {"x-lengthwise-predicted-ttft-ms": f"{prediction.ttft_s * 1000:.0f}",
            "x-lengthwise-predicted-finish-ms": f"{prediction.finish_s * 1000:.0f}"}
