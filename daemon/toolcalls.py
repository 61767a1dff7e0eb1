"""Tool calls read out of a model's text for `tool_choice: "auto"`: what the HTTP layer asks
of a tool parser (vLLM's, by the name in `model.tool_call_parser`; built by the wiring, so
that HTTP never imports vLLM) and the plain data it gets back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import msgspec


class ParsedCall(msgspec.Struct, frozen=True):
    """One complete tool call: `arguments` is JSON text."""

    id: str
    name: str
    arguments: str


class CallDelta(msgspec.Struct, frozen=True):
    """A streamed piece of tool call `index`: its id and name once, then argument text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str | None = None


class ParsedDelta(msgspec.Struct, frozen=True):
    content: str | None = None
    reasoning: str | None = None
    calls: tuple[CallDelta, ...] = ()


class ToolCallReader(Protocol):
    """One answer's parser (parsers keep state while streaming: one per choice)."""

    def whole(self, text: str, token_ids: list[int]) -> tuple[str | None, list[ParsedCall]]:
        """(content left after the calls, the calls) of a complete answer."""
        ...

    def delta(self, text: str, token_ids: list[int], finished: bool) -> ParsedDelta | None:
        """What to stream for these new tokens (None: nothing yet, the parser holds them)."""
        ...


class ToolParsing(Protocol):
    """The configured parser; `request` is the chat request's JSON body."""

    def reader(self, request: dict[str, Any], prompt_token_ids: list[int]) -> ToolCallReader:
        ...

    def readers(self, request: dict[str, Any], prompt_token_ids: list[int], count: int
                ) -> Sequence[ToolCallReader]:
        """`count` readers of one request (one per choice), the request read once."""
        ...
