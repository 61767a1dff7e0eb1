"""Summary metrics on a hand-made trace, computed by hand."""

from __future__ import annotations

import math

import pytest

from bench.metrics import RequestResult, summarize, to_json


def _r(i: int, arrival: float, ttft: float, jct: float, out: int, ok: bool = True
       ) -> RequestResult:
    return RequestResult(index=i, arrival_s=arrival, prompt_tokens=10, output_tokens=out,
                         ok=ok, ttft_s=ttft, jct_s=jct)


TRACE = [
    _r(0, 0.0, 0.5, 2.5, 5),  # tpot (2.5-0.5)/4 = 0.5
    _r(1, 1.0, 1.0, 4.0, 4),  # tpot 1.0; finishes at 5.0
    _r(2, 2.0, 0.2, 1.2, 11),  # tpot 0.1
    _r(3, 3.0, 0.0, 0.0, 0, ok=False),
]


def test_summary_by_hand() -> None:
    s = summarize(TRACE, slo_ttft=0.6, slo_tpot=0.6)
    assert (s.n_completed, s.n_failed) == (3, 1)
    assert s.mean_jct == pytest.approx((2.5 + 4.0 + 1.2) / 3)
    assert s.p50_jct == pytest.approx(2.5)
    assert s.p99_jct == pytest.approx(2.5 + 0.98 * 1.5)  # linear between 2.5 and 4.0
    assert s.mean_ttft == pytest.approx(1.7 / 3)
    assert s.p50_ttft == pytest.approx(0.5)
    assert s.mean_tpot == pytest.approx((0.5 + 1.0 + 0.1) / 3)
    # makespan: first arrival 0.0 -> last finish 5.0 (request 1)
    assert s.throughput_rps == pytest.approx(3 / 5.0)
    assert s.throughput_tps == pytest.approx(20 / 5.0)
    assert s.norm_latency == pytest.approx((2.5 / 5 + 4.0 / 4 + 1.2 / 11) / 3)
    assert s.goodput_rps == pytest.approx(2 / 5.0)  # request 1 misses both SLOs


def test_no_slo_means_goodput_is_throughput() -> None:
    s = summarize(TRACE)
    assert s.goodput_rps == s.throughput_rps


def test_json_has_exactly_the_issue_fields_and_no_nan() -> None:
    import json

    empty = json.loads(to_json(summarize([_r(0, 0.0, 0, 0, 0, ok=False)])))
    assert list(empty) == ["n_completed", "n_failed", "mean_jct", "p50_jct", "p95_jct",
                           "p99_jct", "mean_ttft", "p50_ttft", "p99_ttft", "mean_tpot", "throughput_rps",
                           "throughput_tps", "norm_latency", "goodput_rps", "n_refused",
                           "p50_refusal_s", "p99_refusal_s"]
    assert empty["mean_jct"] is None and not any(
        isinstance(v, float) and math.isnan(v) for v in empty.values())


def test_refusals_are_counted_from_either_client() -> None:
    ours = _r(0, 0.0, 0, 0, 0, ok=False)
    ours.error = "HTTP 429: {...}"
    vllms = _r(1, 0.0, 0, 0, 0, ok=False)
    vllms.error = "Too Many Requests"
    other = _r(2, 0.0, 0, 0, 0, ok=False)
    other.error = "HTTP 500: boom"
    assert summarize([ours, vllms, other]).n_refused == 2
    ours.jct_s, vllms.jct_s = 0.012, math.nan  # our client times the 429; vLLM's does not
    s = summarize([ours, vllms, other])
    assert s.p50_refusal_s == s.p99_refusal_s == 0.012
