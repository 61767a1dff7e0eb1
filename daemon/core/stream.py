"""One job's output on its way to the client: what its executor generated, as text, with
stop strings applied, and how the job ended. Shared by the executor running the job (it
pushes) and the HTTP response (it reads); the core only ends it.

Deltas the reader has not taken yet are merged, so a reader that falls behind (a slow client,
a busy loop) gets one larger delta instead of many small ones, as vLLM's own output
collector does. The end comes after every delta pushed before it.

Stop strings are checked here, over the text already generated plus the new text, not by
vLLM: vLLM checks them only within one engine request. A preempted job resumes as a new
engine request whose prompt holds the tokens already generated, so a stop string that
straddles the preemption point would be missed, and the few characters vLLM holds back (a
possible start of a stop string) would be lost when the first request is aborted. The stream
lives as long as the job, across dispatches and executors, so it keeps the held-back tail.

Semantics follow vLLM's detokenizer: a match must end in the new text, the one that completes
first wins, none is looked for until more than `min_tokens` tokens exist, the stop string
itself is not part of the output, and up to len(longest stop string) - 1 characters are held
back while streaming. One difference: vLLM drops tokens that follow the stop string within one
engine step; a delta here may merge several steps, and its tokens all count in usage.
With `include_stop_str_in_output` the stop string ends the text and nothing is held back
(what is kept is only context for finding a stop string across deltas).

Logprobs travel with their tokens (one position per token id, in order), so a preemption
neither loses nor repeats one: each dispatch pushes only the tokens it generated. Prompt
logprobs are set once, by the first dispatch that gets them.
"""

from __future__ import annotations

import asyncio

import msgspec


class TokenLogprob(msgspec.Struct, frozen=True, array_like=True):
    """One candidate at one position: what vLLM's Logprob says about a token id."""

    token_id: int
    logprob: float
    rank: int | None  # 1 = the most likely; None where the engine gave none
    token: str | None  # its text as the engine decoded it (None where it did not)


# One position: the sampled (or prompt) token first, then the top candidates, in vLLM's order.
Position = list[TokenLogprob]


class TokenDelta(msgspec.Struct, frozen=True):
    """New output since the last delta the reader took; one or more tokens."""

    text: str
    token_ids: list[int]
    logprobs: list[Position] | None = None  # one per token id, when the request asked


class JobEnd(msgspec.Struct, frozen=True):
    """The last item a stream gives."""

    finish_reason: str | None  # "stop" | "length" | "abort" | "shed" | None on error
    error: str | None = None
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    # Shed (dropped from the queue to keep latency objectives): why, in llm-d's words
    # (x-llm-d-request-dropped-reason).
    dropped: str | None = None


class StopScan(msgspec.Struct, frozen=True):
    """What a delta gives once stop strings are applied."""

    release: str  # text the client may see now
    held: str  # text kept back: it may be the start of a stop string
    stopped: bool  # a stop string was found: the job ends with finish reason "stop"
    stop: str | None = None  # the stop string found


def scan(held: str, new: str, stops: tuple[str, ...], check: bool,
         include: bool = False) -> StopScan:
    """Apply `stops` to `held` (kept back from earlier deltas) + `new`. `check` is False
    while the job has not generated more than min_tokens tokens. `include`: the stop
    string is output too and `held` was output already (kept as context only)."""
    if not stops:
        return StopScan(new if include else held + new, "", False)
    text = held + new
    start = len(held) if include else 0  # where the text not yet output begins
    if check:
        # Only matches that end inside the new text: earlier text was checked already
        # (or was generated before min_tokens was reached, where vLLM does not look).
        # The match that completes first wins, ties by list order (as in vLLM).
        matches = [(i + len(stop), k, i) for k, stop in enumerate(stops)
                   if (i := text.find(stop, max(len(held) - len(stop) + 1, 0))) >= 0]
        if matches:
            end, k, begin = min(matches)
            return StopScan(text[start:end if include else begin], "", True, stops[k])
    keep = max(len(stop) for stop in stops) - 1
    cut = max(len(text) - keep, 0)
    if include:
        return StopScan(new, text[cut:], False)
    return StopScan(text[:cut], text[cut:], False)


class OutputStream:
    """Pushed by the executor running the job, read by one HTTP response."""

    __slots__ = ("_end", "_held", "_ids", "_include", "_logprobs", "_min_tokens",
                 "_prediction", "_stops", "_text", "_waiter", "num_tokens", "prompt_logprobs",
                 "stop_reason", "stopped")

    def __init__(self, stops: tuple[str, ...] = (), min_tokens: int = 0,
                 include_stop: bool = False) -> None:
        self._stops = stops
        self._min_tokens = min_tokens
        self._include = include_stop  # include_stop_str_in_output
        self.num_tokens = 0  # tokens pushed so far, over every dispatch (usage)
        self.stopped = False  # a stop string ended the text: later pushes are dropped
        self.stop_reason: int | str | None = None  # stop string or stop token id
        # Per prompt token (the first has none), once a dispatch asked the engine for them.
        self.prompt_logprobs: list[Position | None] | None = None
        self._held = ""  # text that may be the start of a stop string
        self._text: list[str] = []  # released, not yet read
        self._ids: list[int] = []
        self._logprobs: list[Position] | None = None
        self._end: JobEnd | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._prediction: asyncio.Future[float | None] | None = None

    # ---- the executor's side ------------------------------------------------------------

    def push(self, text: str, token_ids: list[int],
             logprobs: list[Position] | None = None) -> bool:
        """New output of the running job, in order (`logprobs`: one position per token id,
        when asked for). True: a stop string was found, the job is finished ("stop") and
        its executor must stop generating it."""
        if self.stopped or self._end is not None:
            return True
        self.num_tokens += len(token_ids)
        found = scan(self._held, text, self._stops, self.num_tokens > self._min_tokens,
                     self._include)
        self._held = found.held
        self.stopped = found.stopped
        if found.stopped:
            self.stop_reason = found.stop
        if found.release or token_ids:
            self._text.append(found.release)
            self._ids.extend(token_ids)
            if logprobs is not None:
                self._logprobs = (self._logprobs or []) + logprobs
            self._wake()
        return found.stopped

    # ---- the core's side ----------------------------------------------------------------

    def finish(self, finish_reason: str | None, error: str | None = None,
               dropped: str | None = None) -> None:
        """The job ended: text held back for a stop string that never came is output after
        all, then the end. Later calls are ignored."""
        if self._end is not None:
            return
        if self._held and not self.stopped and not self._include:
            self._text.append(self._held)
        self._held = ""
        self._end = JobEnd(finish_reason, error,
                           self.stop_reason if finish_reason == "stop" else None, dropped)
        self.set_prediction(None)
        self._wake()

    def set_prediction(self, tokens: float | None) -> None:
        """The job's first predicted output length (None: it has none, it ended first)."""
        if self._prediction is None:
            self._prediction = asyncio.get_running_loop().create_future()
        if not self._prediction.done():
            self._prediction.set_result(tokens)

    # ---- the reader's side --------------------------------------------------------------

    @property
    def ended(self) -> bool:
        """The core ended the job (the end may still be unread)."""
        return self._end is not None

    async def prediction(self) -> float | None:
        """The first prediction, once the core has it (for response headers)."""
        if self._prediction is None:
            self._prediction = asyncio.get_running_loop().create_future()
        return await self._prediction

    async def next(self) -> TokenDelta | JobEnd:
        """Everything pushed since the last call, as one delta, else the end; waits."""
        while not self._text and self._end is None:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._text:
            delta = TokenDelta("".join(self._text), self._ids, self._logprobs)
            self._text, self._ids, self._logprobs = [], [], None
            return delta
        assert self._end is not None
        return self._end

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
