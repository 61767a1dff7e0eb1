"""Execution-time estimates from the engine's fitted cost model: the core's starvation bound
(a job's predicted service time), ALISE's remaining time and SCLS's batch serving time.

The coefficients are those `lengthwise profile` fits on the real engine (and the simulated
executor runs): a step costs
    prefill_base + prefill_per_token * new_tokens                        (if any prefill)
  + decode_base + decode_per_seq * batch + decode_per_context_token * context_tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple, dataclass
from typing import Protocol

# The coefficients in order: CostModel's fields, the learned clock's vector (core/clock.py).
TERMS = ("prefill_base_s", "prefill_per_token_s", "decode_base_s", "decode_per_seq_s",
         "decode_per_context_token_s")


class Coefficients(Protocol):
    """What a cost model is built from ([sim] or a profile's fitted coefficients)."""

    @property
    def prefill_base_s(self) -> float: ...
    @property
    def prefill_per_token_s(self) -> float: ...
    @property
    def decode_base_s(self) -> float: ...
    @property
    def decode_per_seq_s(self) -> float: ...
    @property
    def decode_per_context_token_s(self) -> float: ...


def context_reads(context_tokens: float, out_tokens: float) -> float:
    """Context tokens read by the decode steps that make `out_tokens` more tokens after
    `context_tokens`: the context grows by one per step, context + 1, context + 2, ..."""
    return out_tokens * (context_tokens + (out_tokens + 1) / 2) if out_tokens > 0 else 0.0


@dataclass(slots=True, frozen=True)
class CostModel:
    """Defaults: a generic small engine ([sim]'s defaults); real ones come from a profile."""

    prefill_base_s: float = 0.004
    prefill_per_token_s: float = 0.00002
    decode_base_s: float = 0.008
    decode_per_seq_s: float = 0.0005
    decode_per_context_token_s: float = 0.0000002

    @classmethod
    def from_sim(cls, sim: Coefficients) -> CostModel:
        return cls(sim.prefill_base_s, sim.prefill_per_token_s, sim.decode_base_s,
                   sim.decode_per_seq_s, sim.decode_per_context_token_s)

    @classmethod
    def from_vector(cls, values: Sequence[float]) -> CostModel:
        """From the coefficients in TERMS order."""
        return cls(*(float(v) for v in values))

    def vector(self) -> tuple[float, ...]:
        """The coefficients in TERMS order."""
        return astuple(self)

    def step_s(self, prefill_tokens: float, batch: float, context_tokens: float) -> float:
        """One engine step: a prefill of `prefill_tokens` (0: none) and a decode of `batch`
        sequences holding `context_tokens` in all (SimExecutor's step)."""
        return self.prefill_s(prefill_tokens) + (
            self.decode_base_s + self.decode_per_seq_s * batch
            + self.decode_per_context_token_s * context_tokens)

    def prefill_s(self, tokens: float) -> float:
        """Seconds to (re)compute the KV of `tokens` tokens; 0 for none."""
        return self.prefill_base_s + self.prefill_per_token_s * tokens if tokens > 0 else 0.0

    def decode_share_s(self, context_tokens: float, out_tokens: float, batch: int) -> float:
        """One job's share of the decode steps that produce `out_tokens` more tokens, when
        it decodes in a batch of `batch` jobs: the step's fixed cost is split, the per-seq
        and per-context costs are its own. Context grows by one token per step.

        ALISE's T_decode(L_in, L_out): its equations are lost in the text; the prose says
        decode time is linear in output length with a per-token cost linear in input length,
        which this is (plus the growth of the context over the output).
        """
        if out_tokens <= 0:
            return 0.0
        return self.decode_total_s(out_tokens, context_reads(context_tokens, out_tokens), batch)

    def decode_total_s(self, out_tokens: float, reads: float, batch: int) -> float:
        """Σ decode_share_s over jobs, from two sums over them: their out_tokens and their
        context_reads (daemon.core.work keeps both per executor)."""
        per_step = self.decode_base_s / max(batch, 1) + self.decode_per_seq_s
        return out_tokens * per_step + self.decode_per_context_token_s * reads

    def wall_s(self, prefill_tokens: float, context_tokens: float, out_tokens: float,
               batch: int) -> float:
        """Seconds a job takes from launch to its last token while it decodes in a batch of
        `batch` jobs: its (re)prefill, then `out_tokens` whole steps of that batch."""
        if out_tokens <= 0:
            return self.prefill_s(prefill_tokens)
        mean_context = context_tokens + (out_tokens + 1) / 2
        step = (self.decode_base_s + self.decode_per_seq_s * batch
                + self.decode_per_context_token_s * batch * mean_context)
        return self.prefill_s(prefill_tokens) + out_tokens * step

    def job_time_s(self, prefill_tokens: float, context_tokens: float, out_tokens: float,
                   batch: int) -> float:
        """ALISE's T = T_prefill(L_in) + T_decode(L_in, L_out), for what is left of a job."""
        return self.prefill_s(prefill_tokens) + self.decode_share_s(
            context_tokens, out_tokens, batch)

    def batch_serve_s(self, size: int, input_len: int, slice_tokens: int) -> float:
        """SCLS's T_serve(N, L_i, S) (its Eq. 1-4): prefill N padded inputs of L_i tokens,
        then S decode iterations of N sequences whose cached length grows from L_i + 1."""
        n, s = size, slice_tokens
        prefill = self.prefill_s(n * input_len)
        steps = s * (self.decode_base_s + self.decode_per_seq_s * n)
        context = self.decode_per_context_token_s * n * (s * input_len + s * (s + 1) / 2)
        return prefill + steps + context
