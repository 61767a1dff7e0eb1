"""A request's size limits at the door, checked before any client-sized work: before its
prompts are tokenized, its fields walked or a job exists (docs/operations.md lists them).

- the body: `server.max_body_bytes` (413), cut while it streams in; large bodies decoded
  one at a time (Bodies);
- vLLM's request limits, read from the installed vLLM by the executors' side
  (daemon/executors/requestlimits.py, handed over as `Service.request_limits`), refused as
  vLLM's server refuses them: 400 in its words, naming the field;
- lengthwise's own: one request's sequences (prompts x n) never exceed what the waiting
  queue holds (`scheduler.max_waiting`); such a request could never be admitted, so it is a
  400 naming the field, not a 429 that a client would retry forever.

Each check reads lengths only (constant time), so that every route calls it first, on the
event loop; what walks the request's contents runs after it, off the loop (routes.py).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import msgspec
from starlette.requests import Request

from daemon.executors.requestlimits import RequestLimits
from daemon.http import translate
from daemon.http.errors import ApiError, bad_request
from daemon.http.schemas import CompletionRequest, SamplingFields

_DIGITS = re.compile(r"[0-9]{1,19}")  # Content-Length as RFC 9110 has it (ASCII digits)


class Bodies:
    """Reads and decodes request bodies. Decoding runs on the event loop (msgspec holds the
    GIL, a worker thread would hold the loop as long) and costs up to tens of ms for a large
    body of small objects: large bodies take turns, with a timer's worth of the loop's time
    between two, so that several at once delay the loop by one decoding, not their sum."""

    LARGE = 64 * 1024  # bytes: smaller bodies decode in well under a millisecond
    GAP_S = 0.001  # after a large body, before the next: due timers and I/O run first

    def __init__(self) -> None:
        self._turn = asyncio.Lock()

    async def read(self, request: Request, kind: type[msgspec.Struct], limit: int) -> Any:
        body = await read_body(request, limit)
        if len(body) < self.LARGE:
            return translate.decode_body(body, kind)
        async with self._turn:
            try:
                return translate.decode_body(body, kind)
            finally:
                await asyncio.sleep(self.GAP_S)


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, at most `limit` bytes (413 beyond, also for a chunked body, cut
    as it streams in)."""
    declared = request.headers.get("content-length")
    if declared is not None and not _DIGITS.fullmatch(declared):
        # httptools refuses these before the app; a server that lets one through must not
        # turn it into a 500
        raise bad_request(f"malformed Content-Length header {declared[:32]!r}",
                          "content-length")
    if declared is not None and int(declared) > limit:
        raise ApiError(413, f"request body exceeds {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"request body exceeds {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def check_sampling(req: SamplingFields, limits: RequestLimits, max_waiting: int,
                   num_prompts: int = 1) -> None:
    """vLLM's limits on the fields every generation request shares (n, stop, bad_words,
    logprob_token_ids) and lengthwise's on its sequences; `num_prompts`: its prompts."""
    n = req.n or 1
    if n > limits.vllm_max_n_sequences:
        raise bad_request(f"n must be at most {limits.vllm_max_n_sequences}, got {n}. To "
                          "increase this limit, set the VLLM_MAX_N_SEQUENCES environment "
                          "variable.", "n")
    check_stop(req.stop, limits)
    if req.bad_words and len(req.bad_words) > limits.vllm_max_num_bad_words:
        # each word is at least one token sequence: more words are more sequences
        raise bad_request(f"Too many bad words: {len(req.bad_words)}. The max number is "
                          f"{limits.vllm_max_num_bad_words}.", "bad_words")
    ids = req.logprob_token_ids
    if ids and len(ids) > limits.max_logprob_token_ids:
        raise bad_request(f"Requested logprob_token_ids of length {len(ids)}, which is "
                          f"greater than max allowed: {limits.max_logprob_token_ids}",
                          "logprob_token_ids")
    check_sequences(num_prompts, n, max_waiting)


def check_stop(stop: str | list[str] | None, limits: RequestLimits) -> None:
    """vLLM's request models cap a `stop` list at VLLM_MAX_STOP_STRINGS entries."""
    if isinstance(stop, list) and len(stop) > limits.vllm_max_stop_strings:
        raise bad_request(f"List should have at most {limits.vllm_max_stop_strings} items "
                          f"after validation, not {len(stop)}. To increase this limit, set "
                          "the VLLM_MAX_STOP_STRINGS environment variable.", "stop")


def check_sequences(num_prompts: int, n: int, max_waiting: int) -> None:
    """lengthwise's own: all of a request's sequences must fit the waiting queue at once
    (its jobs are admitted all or none)."""
    if num_prompts * n <= max_waiting:
        return
    what = f"{num_prompts} prompts x n={n}" if num_prompts > 1 else f"n={n}"
    raise bad_request(f"this request asks for {num_prompts * n} sequences ({what}), more "
                      f"than this server's queue holds ({max_waiting}, "
                      "scheduler.max_waiting): it can never be admitted",
                      "n" if n > 1 else "prompt")


def num_prompts(req: CompletionRequest, limits: RequestLimits) -> int:
    """The prompts of a completions request, counted without walking them (a list whose
    first entry is not a token id is a batch), within VLLM_MAX_COMPLETION_PROMPTS."""
    prompt = req.prompt
    if not isinstance(prompt, list) or not prompt or isinstance(prompt[0], int):
        return 1
    if len(prompt) > limits.vllm_max_completion_prompts:
        raise bad_request(f"prompt list length {len(prompt)} exceeds the maximum allowed "
                          f"count of {limits.vllm_max_completion_prompts}. To increase this "
                          "limit, set the VLLM_MAX_COMPLETION_PROMPTS environment variable.",
                          "prompt")
    return len(prompt)
