"""The carried-penalties logits processor, without an engine: over carried + new output
tokens it changes the logits exactly as vLLM's own presence and frequency penalties do over
an uninterrupted answer, and it follows vLLM's batch updates. (On the real engine, a job
preempted three times and resumed gives the uninterrupted greedy answer:
tests/reliability/test_resume_semantics.py.)"""

from __future__ import annotations

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality
from vllm.v1.sample.ops.penalties import apply_all_penalties

from daemon.executors.vllm_penalties import CarriedPenalties, extra_args

VOCAB = 64
PRESENCE, FREQUENCY = 0.8, 0.6


def _logits(rows: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(0))


def _vllms(logits: torch.Tensor, answers: list[list[int]], penalized: list[bool]
           ) -> torch.Tensor:
    """vLLM's own penalties on uninterrupted answers (rows not penalized: all zero)."""
    rows = len(answers)
    on = torch.tensor(penalized, dtype=torch.float32)
    return apply_all_penalties(logits.clone(), torch.full((rows, 1), VOCAB), on * PRESENCE,
                               on * FREQUENCY, torch.ones(rows), answers)


def _processor(*added: tuple[int, SamplingParams, list[int]]) -> CarriedPenalties:
    processor = CarriedPenalties(None, torch.device("cpu"), False)
    processor.update_state(BatchUpdate(
        batch_size=len(added), removed=[], moved=[],
        added=[(index, params, [1, 2, 3], output) for index, params, output in added]))
    return processor


def _resumed(carried: list[int]) -> SamplingParams:
    return SamplingParams(extra_args=extra_args(PRESENCE, FREQUENCY, carried))


def test_carried_and_new_tokens_are_penalized_as_one_uninterrupted_answer() -> None:
    carried, output = [3, 3, 5, 40], [5, 9]
    processor = _processor((0, _resumed(carried), output), (1, SamplingParams(), [3, 4]))
    logits = _logits(2)
    got = processor.apply(logits.clone())
    assert torch.equal(got, _vllms(logits, [carried + output, [3, 4]], [True, False]))
    assert torch.equal(got[1], logits[1])  # a request without carried penalties is untouched
    assert not processor.is_argmax_invariant()


def test_the_engines_live_output_list_is_followed() -> None:
    output: list[int] = []
    processor = _processor((0, _resumed([7]), output))
    output += [7, 8]  # the engine appends each new token to the list it handed over
    output.append(-1)  # an async-scheduling placeholder (GPU), not a token
    logits = _logits(1)
    assert torch.equal(processor.apply(logits.clone()), _vllms(logits, [[7, 7, 8]], [True]))


def test_removed_and_moved_requests_follow_their_batch_index() -> None:
    processor = _processor((0, _resumed([5, 5]), []), (1, SamplingParams(), []))
    processor.update_state(BatchUpdate(batch_size=2, removed=[], added=[],
                                       moved=[(0, 1, MoveDirectionality.SWAP)]))
    logits = _logits(2)
    assert torch.equal(processor.apply(logits.clone()),
                       _vllms(logits, [[], [5, 5]], [False, True]))
    processor.update_state(BatchUpdate(batch_size=1, removed=[1], added=[], moved=[]))
    assert torch.equal(processor.apply(logits.clone()), logits)
