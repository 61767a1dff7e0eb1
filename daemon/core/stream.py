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
"""

from __future__ import annotations

import asyncio

import msgspec


class TokenDelta(msgspec.Struct, frozen=True):
    """New output since the last delta the reader took; one or more tokens."""

    text: str
    token_ids: list[int]


class JobEnd(msgspec.Struct, frozen=True):
    """The last item a stream gives."""

    finish_reason: str | None  # "stop" | "length" | "abort" | "shed" | None on error
    error: str | None = None
    # Shed (dropped from the queue to keep latency objectives): why, in llm-d's words
    # (x-llm-d-request-dropped-reason).
    dropped: str | None = None


class StopScan(msgspec.Struct, frozen=True):
    """What a delta gives once stop strings are applied."""

    release: str  # text the client may see now
    held: str  # text kept back: it may be the start of a stop string
    stopped: bool  # a stop string was found: the job ends with finish reason "stop"


def scan(held: str, new: str, stops: tuple[str, ...], check: bool) -> StopScan:
    """Apply `stops` to `held` (kept back from earlier deltas) + `new`. `check` is False
    while the job has not generated more than min_tokens tokens."""
    if not stops:
        return StopScan(held + new, "", False)
    text = held + new
    if check:
        # Only matches that end inside the new text: earlier text was checked already
        # (or was generated before min_tokens was reached, where vLLM does not look).
        # The match that completes first wins, ties by list order (as in vLLM).
        matches = [(i + len(stop), k, i) for k, stop in enumerate(stops)
                   if (i := text.find(stop, max(len(held) - len(stop) + 1, 0))) >= 0]
        if matches:
            return StopScan(text[:min(matches)[2]], "", True)
    keep = max(len(stop) for stop in stops) - 1
    cut = max(len(text) - keep, 0)
    return StopScan(text[:cut], text[cut:], False)


class OutputStream:
    """Pushed by the executor running the job, read by one HTTP response."""

    __slots__ = ("_end", "_held", "_ids", "_min_tokens", "_prediction", "_stops", "_text",
                 "_waiter", "num_tokens", "stopped")

    def __init__(self, stops: tuple[str, ...] = (), min_tokens: int = 0) -> None:
        self._stops = stops
        self._min_tokens = min_tokens
        self.num_tokens = 0  # tokens pushed so far, over every dispatch (usage)
        self.stopped = False  # a stop string ended the text: later pushes are dropped
        self._held = ""  # text that may be the start of a stop string
        self._text: list[str] = []  # released, not yet read
        self._ids: list[int] = []
        self._end: JobEnd | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._prediction: asyncio.Future[float | None] | None = None

    # ---- the executor's side ------------------------------------------------------------

    def push(self, text: str, token_ids: list[int]) -> bool:
        """New output of the running job, in order. True: a stop string was found, the job
        is finished ("stop") and its executor must stop generating it."""
        if self.stopped or self._end is not None:
            return True
        self.num_tokens += len(token_ids)
        found = scan(self._held, text, self._stops, self.num_tokens > self._min_tokens)
        self._held = found.held
        self.stopped = found.stopped
        if found.release or token_ids:
            self._text.append(found.release)
            self._ids.extend(token_ids)
            self._wake()
        return found.stopped

    # ---- the core's side ----------------------------------------------------------------

    def finish(self, finish_reason: str | None, error: str | None = None,
               dropped: str | None = None) -> None:
        """The job ended: text held back for a stop string that never came is output after
        all, then the end. Later calls are ignored."""
        if self._end is not None:
            return
        if self._held and not self.stopped:
            self._text.append(self._held)
        self._held = ""
        self._end = JobEnd(finish_reason, error, dropped)
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
            delta = TokenDelta("".join(self._text), self._ids)
            self._text, self._ids = [], []
            return delta
        assert self._end is not None
        return self._end

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
