"""SimExecutor: the executor interface on a cost model instead of an engine.

Jobs run in batched steps like a continuous-batching engine: each step costs
`prefill(new prompt tokens) + decode(batch size, context tokens)` seconds on the event
loop's clock (real time, or virtual time on VirtualClockLoop) and gives every running job
one token. Token ids are a deterministic function of (prompt, position).
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
from dataclasses import dataclass, field

from daemon.core.job import Job
from daemon.executors.base import EngineStats, Executor
from daemon.executors.settings import SIM_KV_BLOCK_TOKENS, SimConfig

_NATURAL_MIN, _NATURAL_MAX = 16, 512  # output length range when the model "decides"


@dataclass(slots=True)
class _Seq:
    job: Job
    max_new_tokens: int
    natural_len: int  # where a model would stop by itself (EOS)
    seed: int  # of the prompt; token ids derive from it (hashing per token is too slow)
    num_produced: int = 0
    prefilled: bool = False
    tokens: asyncio.Queue[tuple[int, str | None]] = field(default_factory=asyncio.Queue)


def _prompt_seed(job: Job) -> int:
    digest = hashlib.blake2b(repr(job.prompt_token_ids).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class SimExecutor(Executor):
    def __init__(self, name: str, max_running: int, cost: SimConfig) -> None:
        super().__init__(name, max_running)
        self.cost = cost
        self._seqs: list[_Seq] = []
        self._kick = asyncio.Event()
        self._stepper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._stepper = asyncio.create_task(self._step_loop(), name=f"{self.name}:steps")

    async def shutdown(self) -> None:
        await self.stop_all_tasks()
        if self._stepper is not None:
            self._stepper.cancel()
            await asyncio.gather(self._stepper, return_exceptions=True)

    async def restart_engine(self) -> None:
        await self.shutdown()
        self._seqs.clear()
        await self.start()

    def step_time_s(self, prefill_tokens: int, batch: int, context_tokens: int) -> float:
        c = self.cost
        prefill = c.prefill_base_s + c.prefill_per_token_s * prefill_tokens if prefill_tokens else 0.0
        decode = (c.decode_base_s + c.decode_per_seq_s * batch
                  + c.decode_per_context_token_s * context_tokens)
        return prefill + decode

    @staticmethod
    def _natural_len(job: Job, seed: int) -> int:
        if job.true_output_tokens is not None:
            return job.true_output_tokens
        return _NATURAL_MIN + seed % (_NATURAL_MAX - _NATURAL_MIN)

    async def _generate(self, job: Job, max_new_tokens: int, engine_priority: int) -> str | None:
        # ignore_eos: the "model" never stops by itself, max_tokens ends the job.
        seed = _prompt_seed(job)
        natural = sys.maxsize if job.sampling.ignore_eos else self._natural_len(job, seed)
        seq = _Seq(job, max_new_tokens, max(natural, job.sampling.min_tokens, 1), seed)
        self._seqs.append(seq)
        self._kick.set()
        loop = asyncio.get_running_loop()
        try:
            while True:
                token_id, finish = await seq.tokens.get()
                if job.emit(f" t{token_id}", [token_id], loop.time()):
                    return "stop"  # a stop string
                if finish is not None:
                    return finish
                if job.stop_request is not None:
                    return None
        finally:
            self._seqs.remove(seq)

    async def _step_loop(self) -> None:
        while True:
            if not self._seqs:
                self._kick.clear()
                await self._kick.wait()
                continue
            batch = list(self._seqs)
            prefill = sum(len(s.job.prompt_token_ids) + s.job.num_generated_tokens
                          for s in batch if not s.prefilled)
            context = sum(len(s.job.prompt_token_ids) + s.job.num_generated_tokens for s in batch)
            await asyncio.sleep(self.step_time_s(prefill, len(batch), context))
            for seq in batch:
                if seq in self._seqs and seq.num_produced < seq.max_new_tokens:
                    self._advance(seq)

    def engine_stats(self) -> EngineStats:
        """As vLLM would report them, computed when asked: every admitted job runs in the
        batch, and each holds the KV blocks of its prompt and output so far."""
        blocks = self.cost.kv_capacity_tokens // SIM_KV_BLOCK_TOKENS
        held = sum(-(-(len(s.job.prompt_token_ids) + s.job.num_generated_tokens)
                     // SIM_KV_BLOCK_TOKENS) for s in self._seqs)
        return EngineStats(num_running_reqs=len(self._seqs),
                           kv_cache_usage=min(held / blocks, 1.0),
                           block_size=SIM_KV_BLOCK_TOKENS, num_gpu_blocks=blocks)

    def _advance(self, seq: _Seq) -> None:
        seq.prefilled = True
        position = seq.job.tokens_at_dispatch + seq.num_produced
        seq.num_produced += 1
        token_id = (seq.seed + 7919 * position) % self.cost.vocab_size
        finish: str | None = None
        if position + 1 >= seq.natural_len:
            finish = "stop"
        elif seq.num_produced >= seq.max_new_tokens:
            finish = "length"
        seq.tokens.put_nowait((token_id, finish))
