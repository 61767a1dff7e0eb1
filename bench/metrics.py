"""Per-request results, the summary every bench command prints (`bench run`, `sim`,
`compare`, `frontier`), the spread of repeated runs and ratios to a baseline."""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec
import numpy as np


class RequestResult(msgspec.Struct, kw_only=True):
    index: int
    arrival_s: float  # scheduled arrival, seconds from the run's start
    prompt_tokens: int
    output_tokens: int  # tokens actually received
    ok: bool
    # JSON writes nan as null; read back, null is nan again (__post_init__): always a float.
    ttft_s: float | None = math.nan  # arrival -> first output token
    jct_s: float | None = math.nan  # arrival -> last output token (failed: -> the error)
    error: str = ""

    def __post_init__(self) -> None:
        if self.ttft_s is None:
            self.ttft_s = math.nan
        if self.jct_s is None:
            self.jct_s = math.nan

    @property
    def finish_s(self) -> float:
        return self.arrival_s + self.jct_s

    @property
    def tpot_s(self) -> float:
        """Mean time between output tokens after the first; nan for one-token answers."""
        if self.output_tokens < 2:
            return math.nan
        return (self.jct_s - self.ttft_s) / (self.output_tokens - 1)


class Summary(msgspec.Struct, kw_only=True):
    """Exactly the fields of the issue; seconds, requests/s and tokens/s."""

    n_completed: int
    n_failed: int
    mean_jct: float
    p50_jct: float
    p95_jct: float
    p99_jct: float
    mean_ttft: float
    p50_ttft: float
    p99_ttft: float
    mean_tpot: float
    throughput_rps: float
    throughput_tps: float
    norm_latency: float  # mean over requests of JCT / output tokens (s/token)
    goodput_rps: float  # completed requests meeting both SLOs, per second
    n_refused: int = 0  # failed with 429 (refused or shed to keep latency objectives)
    # Seconds from arrival to the 429, where the client timed it (ours does; vLLM's not).
    p50_refusal_s: float | None = None
    p99_refusal_s: float | None = None


def _mean(values: Sequence[float]) -> float:
    clean = [v for v in values if not math.isnan(v)]
    return float(np.mean(clean)) if clean else math.nan


def _pct(values: Sequence[float], q: float) -> float:
    clean = [v for v in values if not math.isnan(v)]
    return float(np.percentile(clean, q)) if clean else math.nan


def meets_slo(r: RequestResult, slo_ttft: float | None, slo_tpot: float | None) -> bool:
    if slo_ttft is not None and not r.ttft_s <= slo_ttft:
        return False
    tpot = r.tpot_s
    return slo_tpot is None or math.isnan(tpot) or tpot <= slo_tpot


def summarize(results: Sequence[RequestResult], slo_ttft: float | None = None,
              slo_tpot: float | None = None) -> Summary:
    """Throughputs are over the makespan: first scheduled arrival to last completion."""
    done = [r for r in results if r.ok]
    jct = [r.jct_s for r in done]
    start = min((r.arrival_s for r in results), default=0.0)
    end = max((r.finish_s for r in done), default=start)
    span = end - start
    per_s = (lambda n: n / span) if span > 0 else (lambda n: math.nan)
    good = sum(1 for r in done if meets_slo(r, slo_ttft, slo_tpot))
    refused = [r for r in results if not r.ok and is_refused(r.error)]
    return Summary(
        n_completed=len(done), n_failed=len(results) - len(done),
        mean_jct=_mean(jct), p50_jct=_pct(jct, 50), p95_jct=_pct(jct, 95),
        p99_jct=_pct(jct, 99), mean_ttft=_mean([r.ttft_s for r in done]),
        p50_ttft=_pct([r.ttft_s for r in done], 50), p99_ttft=_pct([r.ttft_s for r in done], 99), mean_tpot=_mean([r.tpot_s for r in done]),
        throughput_rps=per_s(len(done)),
        throughput_tps=per_s(sum(r.output_tokens for r in done)),
        norm_latency=_mean([r.jct_s / r.output_tokens for r in done if r.output_tokens > 0]),
        goodput_rps=per_s(good),
        n_refused=len(refused),
        p50_refusal_s=_known(_pct([r.jct_s for r in refused], 50)),
        p99_refusal_s=_known(_pct([r.jct_s for r in refused], 99)),
    )


def _known(value: float) -> float | None:
    return None if math.isnan(value) else value


def is_refused(error: str) -> bool:
    """A 429 as our client ("HTTP 429: ...") or vLLM's ("Too Many Requests") reports it."""
    return error.startswith("HTTP 429") or "Too Many Requests" in error


def _nan_to_none(value: object) -> object:
    return None if isinstance(value, float) and math.isnan(value) else value


def to_json(summary: Summary, extra: dict[str, object] | None = None) -> str:
    """NaN (no data) becomes null: strict JSON readers refuse NaN. `extra` keys follow."""
    fields = {k: _nan_to_none(v) for k, v in
              {**msgspec.structs.asdict(summary), **(extra or {})}.items()}
    return msgspec.json.encode(fields).decode()


# The headline metrics of tables, repeats and ratios (Summary field names).
HEADLINE = ("mean_ttft", "p50_ttft", "p99_ttft", "mean_jct", "p50_jct", "p99_jct", "throughput_rps",
            "throughput_tps", "goodput_rps")


class Spread(msgspec.Struct, frozen=True):
    median: float
    min: float
    max: float


def spread(summaries: Sequence[Summary], field: str) -> Spread:
    values = [getattr(s, field) for s in summaries]
    clean = [v for v in values if v is not None and not math.isnan(v)]
    if not clean:
        return Spread(math.nan, math.nan, math.nan)
    return Spread(float(np.median(clean)), min(clean), max(clean))


def median_summary(summaries: Sequence[Summary]) -> Summary:
    """Field by field median of repeated runs (counts included): what tables and plots show."""
    if len(summaries) == 1:
        return summaries[0]
    fields: dict[str, float | int] = {f: spread(summaries, f).median
                                      for f in Summary.__struct_fields__}
    for count in ("n_completed", "n_failed", "n_refused"):
        fields[count] = round(fields[count])
    return msgspec.convert(fields, Summary)


def ratios(summary: Summary, base: Summary, fields: Sequence[str] = HEADLINE
           ) -> dict[str, float]:
    """summary / base per field (nan where the base is 0 or missing)."""
    out = {}
    for f in fields:
        ref = getattr(base, f)
        out[f] = getattr(summary, f) / ref if ref and not math.isnan(ref) else math.nan
    return out
