"""Presence and frequency penalties that survive a preemption (a vLLM logits processor,
part of the vLLM executor: loaded into the engine by vllm.py).

vLLM applies these penalties to a request's output tokens only. A resumed job is a new
engine request whose prompt holds the tokens the job generated before, so vLLM's own
penalties would forget them. For a resumed job with penalties the executor sets vLLM's
built-in penalties to 0 and passes them here, in `extra_args`, with the tokens carried
over; this processor subtracts them counted over carried + new output tokens, with vLLM's
arithmetic (float32, frequency x count, then presence x seen), so greedy output equals an
uninterrupted run's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

EXTRA_ARG = "lengthwise_penalties"  # {"presence": float, "frequency": float, "carried": ids}


def extra_args(presence: float, frequency: float, carried: list[int]) -> dict[str, Any]:
    """What a resumed request's SamplingParams.extra_args carries to the processor."""
    return {EXTRA_ARG: {"presence": presence, "frequency": frequency, "carried": carried}}


@dataclass(slots=True)
class _Penalized:
    presence: torch.Tensor  # float32 scalars, as vLLM keeps its penalties
    frequency: torch.Tensor
    carried: list[int]  # generated before this engine request
    output: list[int]  # vLLM's live list of this request's output tokens


class CarriedPenalties(LogitsProcessor):
    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self._device = device
        self._requests: dict[int, _Penalized] = {}  # batch index -> its penalties

    def is_argmax_invariant(self) -> bool:
        return False  # penalties change greedy choices

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self._requests, batch_update, self._track)

    def _track(self, params: Any, prompt_ids: list[int] | None,
               output_ids: list[int]) -> _Penalized | None:
        spec = (params.extra_args or {}).get(EXTRA_ARG)
        if spec is None:
            return None
        return _Penalized(torch.tensor(float(spec["presence"]), dtype=torch.float32),
                          torch.tensor(float(spec["frequency"]), dtype=torch.float32),
                          list(spec["carried"]), output_ids)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        vocab = logits.shape[1]
        for index, req in self._requests.items():
            # Negative ids are async-scheduling placeholders (GPU), not tokens.
            ids = torch.tensor([t for t in (*req.carried, *req.output) if 0 <= t < vocab],
                               dtype=torch.int64)
            counts = torch.bincount(ids, minlength=vocab).to(logits.device)
            row = logits[index]
            row -= req.frequency.to(logits.device) * counts
            row -= req.presence.to(logits.device) * (counts > 0)
        return logits
