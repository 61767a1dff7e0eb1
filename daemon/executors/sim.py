"""SimExecutor: the executor on a cost model instead of an engine.

Jobs run in batched steps like a continuous-batching engine: each step costs
`prefill(new prompt tokens) + decode(batch size, context tokens)` seconds on the event
loop's clock (real time, or virtual time on VirtualClockLoop) and gives every running job
one token. Token ids are a deterministic function of (prompt, position).
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from daemon.core.events import Capacity, Event
from daemon.core.job import StopRequest
from daemon.core.stream import Position, TokenLogprob
from daemon.executors.base import EngineStats, Executor, Run
from daemon.executors.settings import SIM_KV_BLOCK_TOKENS, EngineConfig, SimConfig

_NATURAL_MIN, _NATURAL_MAX = 16, 512  # output length range when the model "decides"


@dataclass(slots=True, eq=False)
class _Seq:
    run: Run
    natural_len: int  # where a model would stop by itself (EOS), counted from token 0
    seed: int  # of the prompt; token ids derive from it (hashing per token is too slow)
    context_tokens: int  # prompt + output so far
    prefilled: bool = False


def prompt_seed(prompt_token_ids: Sequence[int]) -> int:
    digest = hashlib.blake2b(repr(list(prompt_token_ids)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class SimExecutor(Executor):
    def __init__(self, name: str, inbox: asyncio.Queue[Event], cost: SimConfig,
                 engine: EngineConfig | None = None) -> None:
        super().__init__(name, inbox, engine or EngineConfig())
        self.cost = cost
        self._seqs: dict[str, _Seq] = {}
        self._kick = asyncio.Event()
        self._stepper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._stepper = asyncio.create_task(self._step_loop(), name=f"{self.name}:steps")

    async def _close_engine(self) -> None:
        if self._stepper is not None:
            self._stepper.cancel()
            await asyncio.gather(self._stepper, return_exceptions=True)
            self._stepper = None

    async def restart_engine(self) -> None:
        await self._close_engine()
        self._seqs.clear()
        await self.start()

    def step_time_s(self, prefill_tokens: int, batch: int, context_tokens: int) -> float:
        c = self.cost
        prefill = c.prefill_base_s + c.prefill_per_token_s * prefill_tokens if prefill_tokens else 0.0
        decode = (c.decode_base_s + c.decode_per_seq_s * batch
                  + c.decode_per_context_token_s * context_tokens)
        return prefill + decode

    @staticmethod
    def _natural_len(true_output_tokens: int | None, seed: int) -> int:
        if true_output_tokens is not None:
            return true_output_tokens
        return _NATURAL_MIN + seed % (_NATURAL_MAX - _NATURAL_MIN)

    def _begin(self, run: Run) -> None:
        launch = run.launch
        seed = prompt_seed(launch.prompt_token_ids)
        # ignore_eos: the "model" never stops by itself, max_tokens ends the job.
        natural = sys.maxsize if launch.sampling.ignore_eos else \
            self._natural_len(launch.true_output_tokens, seed)
        context = len(launch.prompt_token_ids) + len(launch.generated_token_ids)
        self._seqs[run.job_id] = _Seq(run, max(natural, launch.sampling.min_tokens, 1), seed,
                                      context)
        self._kick.set()

    def _halt(self, run: Run) -> None:
        if run.stop is StopRequest.ABORT:  # nothing to wait for
            self._seqs.pop(run.job_id, None)
            self._end_run(run, None)
        # a preemption ends at the next step, like an engine's token boundary

    def _drop_runs(self) -> None:
        self._seqs.clear()

    async def _step_loop(self) -> None:
        while True:
            if not self._seqs:
                self._kick.clear()
                await self._kick.wait()
                continue
            batch = list(self._seqs.values())
            prefill = sum(s.context_tokens for s in batch if not s.prefilled)
            context = sum(s.context_tokens for s in batch)
            await asyncio.sleep(self.step_time_s(prefill, len(batch), context))
            for seq in batch:
                if self._seqs.get(seq.run.job_id) is seq:
                    self._advance(seq)

    def capacity(self) -> Capacity:
        return Capacity(self.name, self.cost.kv_capacity_tokens // SIM_KV_BLOCK_TOKENS,
                        SIM_KV_BLOCK_TOKENS, self.config.max_num_seqs)

    def engine_stats(self) -> EngineStats:
        """As vLLM would report them, computed when asked: every admitted job runs in the
        batch, and each holds the KV blocks of its prompt and output so far."""
        blocks = self.cost.kv_capacity_tokens // SIM_KV_BLOCK_TOKENS
        held = sum(-(-s.context_tokens // SIM_KV_BLOCK_TOKENS) for s in self._seqs.values())
        return EngineStats(num_running_reqs=len(self._seqs),
                           kv_cache_usage=min(held / blocks, 1.0),
                           block_size=SIM_KV_BLOCK_TOKENS, num_gpu_blocks=blocks)

    def _prompt_logprobs(self, run: Run) -> None:
        """Made-up prompt logprobs (0.0: every token certain) where the job asks for them."""
        stream, launch = run.launch.stream, run.launch
        if launch.sampling.prompt_logprobs is not None and stream.prompt_logprobs is None:
            stream.prompt_logprobs = [None] + [[TokenLogprob(t, 0.0, 1, f" t{t}")]
                                               for t in launch.prompt_token_ids[1:]]

    def _advance(self, seq: _Seq) -> None:
        """One step's token for one sequence; ends its run where it ends."""
        run = seq.run
        if run.produced == 0:
            self._started(run, 0)
            self._prompt_logprobs(run)
        seq.prefilled = True
        position = len(run.launch.generated_token_ids) + run.produced
        token_id = (seq.seed + 7919 * position) % self.cost.vocab_size
        seq.context_tokens += 1
        finish: str | None = None
        if self._emit(run, f" t{token_id}", [token_id], _fake_logprobs(run, token_id)) \
                or position + 1 >= seq.natural_len:
            finish = "stop"
        elif run.produced >= run.launch.max_new_tokens:
            finish = "length"
        elif run.stop is None:
            return
        del self._seqs[run.job_id]
        self._end_run(run, finish)


def _fake_logprobs(run: Run, token_id: int) -> list[Position] | None:
    """The made-up token certain (0.0), then runners-up, where the job asks for logprobs."""
    wanted = run.launch.sampling.logprobs
    if wanted is None:
        return None
    top = [TokenLogprob(token_id + k, -float(k), k + 1, f" t{token_id + k}")
           for k in range(1, max(wanted, 0))]
    return [[TokenLogprob(token_id, 0.0, 1, f" t{token_id}"), *top]]
