"""The connector's hook trace: off without a path; both halves append to one file; each hook
is recorded a bounded number of times per process."""

from __future__ import annotations

import os
from pathlib import Path

from kvstore.trace import MAX_CALLS_PER_HOOK, HookCall, Trace, read_trace


def test_without_a_path_nothing_is_recorded(tmp_path: Path) -> None:
    trace = Trace(None, "worker")
    assert not trace
    trace.record("save_kv_layer", layer=0)
    assert list(tmp_path.iterdir()) == []


def test_both_halves_append_to_one_file_in_call_order(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    scheduler, worker = Trace(str(path), "scheduler"), Trace(str(path), "worker")
    assert scheduler and worker
    scheduler.record("get_num_new_matched_tokens", request="r1", matched=128)
    worker.record("start_load_kv")
    scheduler.record("request_finished", request="r1")
    pid = os.getpid()
    assert read_trace(path) == [
        HookCall("get_num_new_matched_tokens", "scheduler", pid,
                 {"request": "r1", "matched": 128}),
        HookCall("start_load_kv", "worker", pid, {}),
        HookCall("request_finished", "scheduler", pid, {"request": "r1"})]


def test_each_hook_is_recorded_a_bounded_number_of_times(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    trace = Trace(str(path), "worker")
    for layer in range(MAX_CALLS_PER_HOOK + 10):
        trace.record("save_kv_layer", layer=layer)
    trace.record("wait_for_save")  # other hooks still count from zero
    calls = read_trace(path)
    saves = [c.detail["layer"] for c in calls if c.hook == "save_kv_layer"]
    assert saves == list(range(MAX_CALLS_PER_HOOK))  # the first ones, in order
    assert calls[-1].hook == "wait_for_save"
