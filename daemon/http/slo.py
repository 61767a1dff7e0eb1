"""Latency objectives at the door: a request's objective from llm-d's headers, its API key or
its class's default ([slo] classes); the 429s of requests refused or dropped to keep
objectives, with llm-d's reason header; the predicted latency a response reports.

Precedence, field by field: the request's x-llm-d-slo-ttft-ms / x-llm-d-slo-tpot-ms headers,
then its API key's objective, then its class's (by `priority`). `sheddable` comes from the
key or the class. No bound and not sheddable: best effort (no objective).

The headers as llm-d's router reads them (its metadata.GetLowerCaseHeaderValue): the
deprecated aliases x-slo-ttft-ms / x-slo-tpot-ms count when the new name is absent, and are
ignored when it comes. Stricter than llm-d where it would guess: a value is milliseconds in
ASCII digits with an optional fraction ("250", "12.5"; no sign, exponent, "_" or non-ASCII
space), and one header sent twice with different values is refused, not the first taken.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from daemon.apikeys import MAX_OBJECTIVE_MS, ApiKey, Objective
from daemon.core.job import Slo
from daemon.core.ports import SloUnreachable
from daemon.core.slo import Prediction
from daemon.core.stream import JobEnd
from daemon.http.errors import ApiError

TTFT_HEADER = "x-llm-d-slo-ttft-ms"
TPOT_HEADER = "x-llm-d-slo-tpot-ms"
# llm-d's deprecated aliases of the two, read only when the new name is absent
ALIASES = {TTFT_HEADER: "x-slo-ttft-ms", TPOT_HEADER: "x-slo-tpot-ms"}
_MILLIS = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,12})?")
_OWS = " \t"  # the optional whitespace around a header value (RFC 9110)
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
    """The header's milliseconds (None: neither it nor its alias came); a 400 naming the
    header for a value that is not a number in (0, MAX_OBJECTIVE_MS], or for two values."""
    used, values = name, _values(headers, name)
    if not values:
        used, values = ALIASES[name], _values(headers, ALIASES[name])
    if not values:
        return None
    texts = {v.strip(_OWS) for v in values}
    if len(texts) > 1:
        raise ApiError(400, f"header {used} was sent {len(values)} times with different "
                            "values; send it once", param=used)
    raw = texts.pop()
    value = float(raw) if _MILLIS.fullmatch(raw) else math.nan
    if not 0 < value <= MAX_OBJECTIVE_MS:  # NaN fails too
        raise ApiError(400, f"header {used} must be milliseconds in (0, {MAX_OBJECTIVE_MS:.0f}]"
                            f" (digits, an optional fraction), got {raw[:32]!r}", param=used)
    return value


def _values(headers: Mapping[str, str], name: str) -> list[str]:
    """Every value of a header (starlette's Headers keeps repeats; a plain mapping one)."""
    getlist = getattr(headers, "getlist", None)
    if getlist is not None:
        return list(getlist(name))
    value = headers.get(name)
    return [] if value is None else [value]


def refused(exc: SloUnreachable) -> ApiError:
    """429 for a request that cannot meet its objective, before any engine work."""
    r = exc.refusal
    err = ApiError(429, f"cannot meet the request's latency objective: {r.explain()}; "
                        "retry later", "rate_limit_error",
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
