"""The stream's logprob positions in the OpenAI shapes, as vLLM's server writes them: chat's
`content` list, completions' parallel lists (with text offsets), and prompt logprobs by
token id. -inf becomes -9999.0 (JSON has no infinity)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from daemon.core.stream import Position, TokenLogprob
from daemon.http.responses import (
    ChatLogprobs,
    CompletionLogprobs,
    ContentLogprob,
    PromptLogprob,
    PromptLogprobs,
    TopLogprob,
)

_FLOOR = -9999.0
Decode = Callable[[int], str]  # one token id's text, for positions that have none


class Shape:
    """How a request wants its logprobs: `top` candidates (-1: all the engine gave),
    tokens as "token_id:N" strings or as text."""

    def __init__(self, top: int, as_token_ids: bool, decode: Decode,
                 explicit_ids: bool = False) -> None:
        self.top = top
        self.as_token_ids = as_token_ids
        self.decode = decode
        self.explicit_ids = explicit_ids  # logprob_token_ids: every candidate is wanted

    def token(self, cand: TokenLogprob) -> str:
        if self.as_token_ids:
            return f"token_id:{cand.token_id}"
        return cand.token if cand.token is not None else self.decode(cand.token_id)

    def plain(self, token_id: int) -> str:
        return f"token_id:{token_id}" if self.as_token_ids else self.decode(token_id)


def _floor(value: float) -> float:
    return max(value, _FLOOR)


def _find(position: Position | None, token_id: int) -> TokenLogprob | None:
    if position is None:
        return None
    return next((c for c in position if c.token_id == token_id), None)


def chat(token_ids: Sequence[int], positions: Sequence[Position | None],
         shape: Shape) -> ChatLogprobs:
    content = []
    for token_id, position in zip(token_ids, positions, strict=False):
        own = _find(position, token_id)
        if own is None or position is None:
            text = shape.plain(token_id)
            content.append(ContentLogprob(text, _FLOOR, list(text.encode(errors="replace"))))
            continue
        tops = [TopLogprob(t := shape.token(c), _floor(c.logprob),
                           list(t.encode(errors="replace")))
                for i, c in enumerate(position)
                if shape.explicit_ids or shape.top == -1 or i < shape.top]
        content.append(ContentLogprob(
            shape.token(own), _floor(own.logprob),
            None if own.token is None else list(own.token.encode(errors="replace")), tops))
    return ChatLogprobs(content)


def completion(token_ids: Sequence[int], positions: Sequence[Position | None],
               shape: Shape, text_offset: int = 0) -> CompletionLogprobs:
    out = CompletionLogprobs([], [], [], [])
    last_len = 0
    for token_id, position in zip(token_ids, positions, strict=False):
        own = _find(position, token_id)
        if own is None or position is None:
            token = shape.plain(token_id)
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
        else:
            token = shape.token(own)
            out.token_logprobs.append(_floor(own.logprob))
            out.top_logprobs.append({
                shape.token(c): _floor(c.logprob) for i, c in enumerate(position)
                if shape.explicit_ids or shape.top == -1 or shape.top >= i})
        out.tokens.append(token)
        out.text_offset.append(out.text_offset[-1] + last_len if out.text_offset
                               else text_offset)
        last_len = len(token)
    return out


def prompt(positions: Sequence[Position | None] | None) -> PromptLogprobs | None:
    if positions is None:
        return None
    return [None if p is None else
            {str(c.token_id): PromptLogprob(_floor(c.logprob), c.rank, c.token) for c in p}
            for p in positions]
