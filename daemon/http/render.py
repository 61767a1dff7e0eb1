"""Response bodies and SSE chunks for one answer of n choices (daemon/http/routes.py reads the
jobs' streams): chat and completions, with logprobs, echo, token ids, stop reasons, tool
calls, usage (per chunk with continuous_usage_stats), as vLLM's server writes them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import msgspec

from daemon.core.scheduler import Scheduler
from daemon.core.stream import JobEnd, OutputStream, Position, TokenDelta
from daemon.http import logprobs as lp
from daemon.http.responses import (
    ChatChoice,
    ChatChunkChoice,
    ChatLogprobs,
    ChatMessageOut,
    CompletionChoice,
    Delta,
    ErrorBody,
    ErrorInfo,
    Usage,
)


@dataclass(slots=True, eq=False)
class Choice:
    """One job of an answer: choice `index`, its prompt and what it gave so far."""

    index: int
    job_id: str
    stream: OutputStream
    prompt_ids: list[int]
    prompt_text: str  # what echo puts before the output
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    positions: list[Position] = field(default_factory=list)
    end: JobEnd | None = None
    # where the next streamed logprob token starts in the text streamed so far (completions'
    # text_offset runs on across chunks, as in vLLM)
    next_text_offset: int = 0

    def take(self, delta: TokenDelta) -> None:
        self.text.append(delta.text)
        self.token_ids.extend(delta.token_ids)
        if delta.logprobs is not None:
            self.positions.extend(delta.logprobs)


@dataclass(slots=True)
class Options:
    """What the request asked of the response's shape."""

    model: str
    logprobs: lp.Shape | None  # None: no logprobs
    echo: bool = False
    echo_only: bool = False  # echo with max_tokens 0: the prompt is the answer
    return_token_ids: bool = False
    include_usage: bool = False
    continuous_usage: bool = False


@dataclass(slots=True)
class Prompt:
    """One prompt of a request."""

    ids: list[int]
    text: str  # what echo repeats
    messages: list[dict[str, str]]  # what the predictor reads


class Answer:
    """One admitted request as the response sees it: its jobs (n per prompt), in order."""

    __slots__ = ("choices", "headers", "id", "num_prompt_tokens")

    def __init__(self, answer_id: str, choices: list[Choice], predicted: float | None) -> None:
        self.id = answer_id
        self.choices = choices
        self.num_prompt_tokens = prompt_tokens(choices)
        self.headers = {"x-request-id": answer_id}
        if predicted is not None:
            self.headers["x-lengthwise-predicted-tokens"] = f"{predicted:.0f}"

    def cancel_rest(self, scheduler: Scheduler) -> None:
        """Cancel the jobs not ended yet (the client left, or one job failed)."""
        for c in self.choices:
            if not c.stream.ended:
                scheduler.cancel(c.job_id)

    async def outputs(self) -> AsyncIterator[tuple[Choice, TokenDelta | JobEnd]]:
        """Every choice's outputs as they come; each choice's end after its deltas."""
        if len(self.choices) == 1:
            (one,) = self.choices
            while True:
                item = await one.stream.next()
                yield one, item
                if isinstance(item, JobEnd):
                    return
        # One waiter per choice, each handing itself to `ready` when its item comes: a
        # constant cost per item however many choices (asyncio.wait costs one per choice).
        ready: asyncio.Queue[asyncio.Future[TokenDelta | JobEnd]] = asyncio.Queue()
        pending: dict[asyncio.Future[TokenDelta | JobEnd], Choice] = {}

        def wait_for(choice: Choice) -> None:
            waiter = asyncio.ensure_future(choice.stream.next())
            waiter.add_done_callback(ready.put_nowait)
            pending[waiter] = choice

        for c in self.choices:
            wait_for(c)
        try:
            while pending:
                waiter = await ready.get()
                choice = pending.pop(waiter)
                item = waiter.result()
                yield choice, item
                if not isinstance(item, JobEnd):
                    wait_for(choice)
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)


def sse(obj: object) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


_MARK = "\x00text"


class TextFrame:
    """The SSE event of a delta that carries text only, encoded once around the text: per
    token, only the text is encoded (the bytes equal sse(make(text)))."""

    __slots__ = ("_head", "_tail")

    def __init__(self, make: Callable[[str], object]) -> None:
        self._head, _, self._tail = sse(make(_MARK)).partition(msgspec.json.encode(_MARK))

    def __call__(self, text: str) -> bytes:
        return self._head + msgspec.json.encode(text) + self._tail


def error_event(message: str) -> bytes:
    """A job that failed mid-stream: an OpenAI error object as the last data event."""
    return sse(ErrorBody(ErrorInfo(message, "server_error")))


def usage(choices: list[Choice], num_prompt_tokens: int) -> Usage:
    out = sum(c.stream.num_tokens for c in choices)
    return Usage(num_prompt_tokens, out, num_prompt_tokens + out)


def prompt_tokens(choices: list[Choice]) -> int:
    """Counted once per prompt, however many choices share it (as vLLM)."""
    seen: dict[int, int] = {}
    for c in choices:
        seen.setdefault(id(c.prompt_ids), len(c.prompt_ids))
    return sum(seen.values())


# ---- completions -------------------------------------------------------------------------

def completion_piece(c: Choice, opts: Options, delta: TokenDelta | None, first: bool,
                     end: JobEnd | None) -> CompletionChoice:
    """One choice's piece: the whole answer (delta None, after the end) or one delta."""
    text = "".join(c.text) if delta is None else delta.text
    ids = c.token_ids if delta is None else delta.token_ids
    positions: list[Position | None] = list(c.positions if delta is None
                                            else delta.logprobs or [])
    prompt_positions = c.stream.prompt_logprobs
    if opts.echo_only:
        text, ids, positions = "", [], []
    if opts.echo and first:
        # vLLM echoes no prompt text when the prompt's token ids are returned
        text = ("" if opts.return_token_ids else c.prompt_text) + text
        ids = [*c.prompt_ids, *ids]
        positions = [*(prompt_positions or [None] * len(c.prompt_ids)), *positions]
    logprobs = None
    if opts.logprobs is not None and (ids or delta is None):
        offset = 0 if delta is None else c.next_text_offset
        logprobs = lp.completion(ids, positions, opts.logprobs, offset)
        if logprobs.tokens:
            c.next_text_offset = logprobs.text_offset[-1] + len(logprobs.tokens[-1])
    return CompletionChoice(
        c.index, text, end.finish_reason if end else None, logprobs,
        end.stop_reason if end else None,
        token_ids=(delta.token_ids if delta is not None else c.token_ids)
        if opts.return_token_ids else None,
        prompt_logprobs=lp.prompt(prompt_positions) if delta is None else None,
        prompt_token_ids=c.prompt_ids if opts.return_token_ids and first else None)


# ---- chat --------------------------------------------------------------------------------

def chat_logprobs(c: Choice, opts: Options, ids: list[int], positions: list[Position]
                  ) -> ChatLogprobs | None:
    if opts.logprobs is None:
        return None
    return lp.chat(ids, positions, opts.logprobs)


def chat_choice(c: Choice, opts: Options, message: ChatMessageOut, finish: str | None
                ) -> ChatChoice:
    assert c.end is not None
    return ChatChoice(c.index, message, finish, chat_logprobs(c, opts, c.token_ids,
                                                              c.positions),
                      c.end.stop_reason, c.token_ids if opts.return_token_ids else None)


def chat_piece(c: Choice, opts: Options, delta: TokenDelta) -> ChatChunkChoice | None:
    if not delta.text and not (opts.logprobs and delta.token_ids):
        return None
    return ChatChunkChoice(
        c.index, Delta(content=delta.text),
        logprobs=chat_logprobs(c, opts, delta.token_ids, delta.logprobs or []),
        token_ids=delta.token_ids if opts.return_token_ids else None)
