"""Workloads are a pure function of their spec and seed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.workload import WorkloadSpec, arrival_times, build

AZURE = Path("/work/shared/data/azure_llm_2023_conv.csv")


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
