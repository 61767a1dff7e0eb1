"""Reading /metrics texts: samples summed over the labels asked for, per label, by family."""

from __future__ import annotations

from bench import promtext

TEXT = """vllm:cache_config_info{block_size="16"} 1.0
vllm:cache_config_info{block_size="128"} 1.0
# HELP vllm:num_preemptions_total Preemptions
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0"} 3.0
vllm:num_preemptions_total{engine="1"} 4.0
vllm:num_preemptions_created{engine="0"} 1.7e9
# HELP lengthwise_http_errors_total Requests refused with an error
# TYPE lengthwise_http_errors_total counter
lengthwise_http_errors_total{status="429",type="slo_unreachable"} 5.0
lengthwise_http_errors_total{status="429",type="queue_full"} 2.0
lengthwise_http_errors_total{status="400",type="invalid_request_error"} 9.0
# HELP lengthwise_ttft_phase_seconds Arrival to first token, by phase
# TYPE lengthwise_ttft_phase_seconds histogram
lengthwise_ttft_phase_seconds_bucket{le="+Inf",phase="queue"} 2.0
lengthwise_ttft_phase_seconds_sum{phase="queue"} 1.5
lengthwise_ttft_phase_seconds_count{phase="queue"} 2.0
lengthwise_ttft_phase_seconds_sum{phase="engine"} 0.25
lengthwise_ttft_phase_seconds_count{phase="engine"} 2.0
"""


def test_total_sums_the_samples_of_one_name_carrying_the_labels() -> None:
    assert promtext.total(TEXT, "vllm:num_preemptions_total") == 7.0  # not _created
    assert promtext.total(TEXT, "lengthwise_http_errors_total") == 16.0
    assert promtext.total(TEXT, "lengthwise_http_errors_total", status="429") == 7.0
    assert promtext.total(TEXT, "lengthwise_http_errors_total", status="429",
                          type="queue_full") == 2.0
    assert promtext.total(TEXT, "lengthwise_ttft_phase_seconds_sum") == 1.75
    assert promtext.total(TEXT, "absent_total") == 0.0


def test_by_label_and_families() -> None:
    assert promtext.by_label(TEXT, "lengthwise_ttft_phase_seconds_sum", "phase") == {
        "queue": 1.5, "engine": 0.25}
    assert promtext.by_label(TEXT, "lengthwise_http_errors_total", "type") == {
        "slo_unreachable": 5.0, "queue_full": 2.0, "invalid_request_error": 9.0}
    assert promtext.by_label(TEXT, "absent_total", "phase") == {}
    families = promtext.families(TEXT)
    assert len(families["vllm:cache_config_info"]) == 2  # untyped: one family per line
    assert [s.value for s in families["lengthwise_http_errors"]] == [5.0, 2.0, 9.0]
    assert families["lengthwise_ttft_phase_seconds"][0].labels == {"le": "+Inf",
                                                                   "phase": "queue"}
