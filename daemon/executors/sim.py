"""SimExecutor: the executor on a cost model instead of an engine.

Jobs run in batched steps like a continuous-batching engine: each step costs
`prefill(new prompt tokens) + decode(batch size, context tokens)` seconds on the event
loop's clock (real time, or virtual time on VirtualClockLoop) and gives every running job
one token. Token ids are a deterministic function of (prompt, position).

Memory is vLLM's: the engine holds `kv_capacity_tokens` of KV in `kv_block_tokens` blocks,
and each sequence in its batch holds the blocks of its context. Launched sequences wait in
the engine's own queue, in order, until theirs fit (the first that does not fit holds the
rest back, as vLLM's scheduler does). A step whose sequences need more blocks than the cache
has preempts the most recently started one: its KV is freed, it goes back to the front of
the queue and recomputes its whole context when it runs again (vLLM's recompute preemption,
counted as the engine's preemptions). So a simulated vLLM (every request admitted at once)
pays for a full cache as the engine does, and memory admission's misses show.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from daemon.core.events import Capacity, Event
from daemon.core.job import StopRequest
from daemon.core.stream import Position, TokenLogprob
from daemon.executors.base import EngineStats, Executor, Run
from daemon.executors.settings import EngineConfig, SimConfig

_NATURAL_MIN, _NATURAL_MAX = 16, 512  # output length range when the model "decides"


@dataclass(slots=True, eq=False)
class _Seq:
    run: Run
    natural_len: int  # where a model would stop by itself (EOS), counted from token 0
    seed: int  # of the prompt; token ids derive from it (hashing per token is too slow)
    context_tokens: int  # prompt + output so far
    prefilled: bool = False  # its context's KV is in the cache (else: prefill it first)


def prompt_seed(prompt_token_ids: Sequence[int]) -> int:
    digest = hashlib.blake2b(repr(list(prompt_token_ids)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class SimExecutor(Executor):
    def __init__(self, name: str, inbox: asyncio.Queue[Event], cost: SimConfig,
                 engine: EngineConfig | None = None) -> None:
        super().__init__(name, inbox, engine or EngineConfig())
        self.cost = cost
        self._seqs: dict[str, _Seq] = {}  # every launched sequence not yet ended
        self._running: list[_Seq] = []  # in the batch, the most recently started last
        self._waiting: collections.deque[_Seq] = collections.deque()  # the engine's queue
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
        self._drop_runs()
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
        seq = _Seq(run, max(natural, launch.sampling.min_tokens, 1), seed, context)
        self._seqs[run.job_id] = seq
        self._waiting.append(seq)
        self._kick.set()

    def _halt(self, run: Run) -> None:
        seq = self._seqs.get(run.job_id)
        if run.stop is StopRequest.ABORT or seq is None or seq not in self._running:
            # nothing to wait for: aborted, or queued in the engine (no token boundary)
            if seq is not None:
                self._retire(seq)
            self._end_run(run, None)
        # a running sequence's preemption ends at the next step, at its token boundary

    def _retire(self, seq: _Seq) -> None:
        del self._seqs[seq.run.job_id]
        if seq in self._running:
            self._running.remove(seq)
        else:
            self._waiting.remove(seq)

    def _drop_runs(self) -> None:
        self._seqs.clear()
        self._running.clear()
        self._waiting.clear()

    @property
    def _blocks(self) -> int:
        return max(self.cost.kv_capacity_tokens // self.cost.kv_block_tokens, 1)

    def _blocks_of(self, seq: _Seq, extra: int = 0) -> int:
        return -(-(seq.context_tokens + extra) // self.cost.kv_block_tokens)

    def _schedule(self) -> list[_Seq]:
        """The next step's batch: running sequences, each with room for its next token
        (preempting the most recently started while they do not fit; one runs whatever
        it needs), then waiting ones in order while they fit (module doc)."""
        need = sum(self._blocks_of(seq, 1) for seq in self._running)
        while need > self._blocks and len(self._running) > 1:
            victim = self._running.pop()
            need -= self._blocks_of(victim, 1)
            victim.prefilled = False  # its KV is gone: it recomputes
            self._waiting.appendleft(victim)
            self.engine_preemptions += 1
        while self._waiting and len(self._running) < self.config.max_num_seqs:
            blocks = self._blocks_of(self._waiting[0], 1)
            if need + blocks > self._blocks and self._running:
                break
            self._running.append(self._waiting.popleft())
            need += blocks
        return list(self._running)

    async def _step_loop(self) -> None:
        while True:
            batch = self._schedule()
            if not batch:
                self._kick.clear()
                await self._kick.wait()
                continue
            prefill = sum(s.context_tokens for s in batch if not s.prefilled)
            context = sum(s.context_tokens for s in batch)
            await asyncio.sleep(self.step_time_s(prefill, len(batch), context))
            for seq in batch:
                if self._seqs.get(seq.run.job_id) is seq:
                    self._advance(seq)

    def capacity(self) -> Capacity:
        return Capacity(self.name, self._blocks, self.cost.kv_block_tokens,
                        self.config.max_num_seqs)

    def engine_stats(self) -> EngineStats:
        """As vLLM would report them, computed when asked: the batch, the engine's queue,
        and the blocks the batch's contexts hold."""
        held = sum(self._blocks_of(seq) for seq in self._running)
        return EngineStats(num_running_reqs=len(self._running),
                           num_waiting_reqs=len(self._waiting),
                           kv_cache_usage=min(held / self._blocks, 1.0),
                           block_size=self.cost.kv_block_tokens, num_gpu_blocks=self._blocks)

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
        self._retire(seq)
        self._end_run(run, finish)


def _fake_logprobs(run: Run, token_id: int) -> list[Position] | None:
    """The made-up token certain (0.0), then runners-up, where the job asks for logprobs."""
    wanted = run.launch.sampling.logprobs
    if wanted is None:
        return None
    top = [TokenLogprob(token_id + k, -float(k), k + 1, f" t{token_id + k}")
           for k in range(1, max(wanted, 0))]
    return [[TokenLogprob(token_id, 0.0, 1, f" t{token_id}"), *top]]
