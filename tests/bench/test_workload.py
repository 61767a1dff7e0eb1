"""Workloads are a pure function of their spec and seed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.workload import WorkloadSpec, arrival_times, build
from tests.support import AZURE_CONV as AZURE


def _records(tmp_path: Path) -> Path:
    path = tmp_path / "records.jsonl"
    lines = [f'{{"prompt": "question {i} about things", "output_tokens": {10 + 7 * i}}}'
             for i in range(40)]
    lines.append('{"id": "x#1", "messages": [{"role": "user", "content": "hi"}], '
                 '"response": "hello", "output_tokens": 3}')
    path.write_text("\n".join(lines))
    return path


def test_same_seed_same_workload(tmp_path: Path) -> None:
    spec = WorkloadSpec(arrivals="gamma", cv=2.0, rate=3.0, num=30,
                        lengths=f"records:{_records(tmp_path)}", seed=7)
    assert build(spec) == build(spec)
    other = build(WorkloadSpec(**{**_fields(spec), "seed": 8}))
    assert other != build(spec)


def _fields(spec: WorkloadSpec) -> dict[str, object]:
    return {f: getattr(spec, f) for f in spec.__struct_fields__}


def test_rate_changes_times_not_prompts(tmp_path: Path) -> None:
    base = WorkloadSpec(num=20, lengths=f"records:{_records(tmp_path)}", rate=1.0)
    fast = WorkloadSpec(**{**_fields(base), "rate": 4.0})
    a, b = build(base), build(fast)
    assert [r.messages for r in a] == [r.messages for r in b]
    assert b[-1].arrival_s < a[-1].arrival_s


@pytest.mark.parametrize("arrivals,cv", [("poisson", 1.0), ("gamma", 3.0)])
def test_arrival_rate_and_burstiness(arrivals: str, cv: float) -> None:
    times = arrival_times(WorkloadSpec(arrivals=arrivals, cv=cv, rate=5.0, num=20000))
    gaps = np.diff(times)
    assert times[0] == 0.0
    assert abs(gaps.mean() - 0.2) < 0.02
    assert abs(gaps.std() / gaps.mean() - cv) < 0.15 * cv


def test_trace_rescaled_and_paired() -> None:
    spec = WorkloadSpec(arrivals=f"trace:{AZURE}", lengths=f"trace:{AZURE}", rate=2.0, num=50,
                        seed=3, max_input=4096)
    reqs = build(spec)
    assert reqs[-1].arrival_s == pytest.approx(49 / 2.0)
    assert build(spec) == reqs
    assert all(r.prompt_tokens + r.output_tokens < spec.max_model_len for r in reqs)


def test_scale_cap_and_context(tmp_path: Path) -> None:
    spec = WorkloadSpec(num=41, lengths=f"records:{_records(tmp_path)}", scale=2.0, cap=100)
    outs = sorted(r.output_tokens for r in build(spec))
    assert outs[0] == 6 and max(outs) == 100  # 3 x 2, and everything capped at 100


def test_request_body_forces_length_and_salts_only_the_first_message() -> None:
    from bench.client import ClientOptions, request_body
    from bench.workload import Message, Request

    req = Request(0, 0.0, [Message("system", "be brief"), Message("user", "hi")], 5, 17)
    body = request_body(req, ClientOptions(salt="run 2. "), "m")
    assert [m["content"] for m in body["messages"]] == ["run 2. be brief", "hi"]
    assert body["max_tokens"] == body["min_tokens"] == 17 and body["ignore_eos"] is True
    assert request_body(req, ClientOptions(), "m")["messages"][0]["content"] == "be brief"


def test_at_rate_is_build_at_that_rate(tmp_path: Path) -> None:
    from bench.workload import at_rate

    for arrivals in ("poisson", "gamma", f"trace:{AZURE}"):
        spec = WorkloadSpec(arrivals=arrivals, cv=2.5, rate=1.0, num=25,
                            lengths=f"records:{_records(tmp_path)}")
        fast = build(WorkloadSpec(**{**_fields(spec), "rate": 3.0}))
        moved = at_rate(build(spec), 1.0, 3.0)
        assert [r.arrival_s for r in moved] == pytest.approx([r.arrival_s for r in fast])
        assert [r.messages for r in moved] == [r.messages for r in fast]


def test_lognormal_lengths_are_sharegpt_like() -> None:
    reqs = build(WorkloadSpec(lengths="lognormal", num=400, max_model_len=8192,
                              max_input=4096))
    outs = np.array([r.output_tokens for r in reqs])
    assert 140 < np.median(outs) < 230  # median ~180 tokens
    assert all(r.prompt_tokens >= 1 for r in reqs) and build(
        WorkloadSpec(lengths="lognormal", num=400, max_model_len=8192, max_input=4096)) == reqs


def test_sharegpt_dev_is_held_out_of_training() -> None:
    """dev = training-side conversations that predictor.split.is_dev holds out (the shipped
    predictor trained on the rest), minus prompts a trained-on conversation also opens with."""
    from collections import Counter

    from bench.workload.lengths import _sharegpt

    dev, train = _sharegpt("dev"), _sharegpt("train")
    key = lambda c: tuple((m.role, m.content) for m in c[0])
    dev_keys = Counter(key(c) for c in dev)
    trained = Counter(key(c) for c in train) - dev_keys  # what is left once dev is taken out
    assert dev_keys and not any(k in trained for k in dev_keys)
    assert 0.08 < len(dev) / len(train) < 0.16  # about 2/16 of conversations


def test_in_sample_runs_are_labelled_and_warned(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.workload import sample_label, warn_sample

    assert WorkloadSpec().lengths == "sharegpt:dev"
    labels = {k: sample_label(WorkloadSpec(lengths=k)) for k in
              ("sharegpt:dev", "sharegpt:train", "sharegpt:test", "lognormal")}
    assert labels == {"sharegpt:dev": "held-out", "sharegpt:train": "in-sample",
                      "sharegpt:test": "reserved-test", "lognormal": "external"}
    warn_sample(WorkloadSpec(lengths="sharegpt:train"))
    assert "in-sample" in capsys.readouterr().err
    warn_sample(WorkloadSpec(lengths="sharegpt:test"))
    assert "reserved" in capsys.readouterr().err
    warn_sample(WorkloadSpec())
    assert capsys.readouterr().err == ""
