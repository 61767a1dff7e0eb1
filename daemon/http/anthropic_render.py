"""An admitted chat job's answer in Anthropic's shapes, as vLLM's Anthropic server writes
them (`messages_full_converter`, `message_stream_converter`): the whole message (text, then
tool_use blocks; one empty text block for an empty answer) or the event stream
(message_start with the first output, then content blocks one at a time, message_delta with
the stop reason and usage, message_stop). Only the answer's first choice: the Messages API
has no `n`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgspec

from daemon.core.scheduler import Scheduler
from daemon.core.stream import JobEnd, TokenDelta
from daemon.http import chat, tools
from daemon.http.anthropic_schemas import (
    AnthropicBlockDelta,
    AnthropicBlockStart,
    AnthropicBlockStop,
    AnthropicError,
    AnthropicErrorResponse,
    AnthropicJsonDelta,
    AnthropicMessageDelta,
    AnthropicMessageHead,
    AnthropicMessagesResponse,
    AnthropicMessageStart,
    AnthropicMessageStop,
    AnthropicStopDelta,
    AnthropicTextBlock,
    AnthropicTextDelta,
    AnthropicToolUseBlock,
    AnthropicUsage,
    OutBlock,
    StopReason,
)
from daemon.http.errors import bad_request
from daemon.http.render import Answer, Options, TextFrame
from daemon.http.schemas import NamedToolChoice
from daemon.toolcalls import ParsedDelta, ToolCallReader


@dataclass(slots=True)
class ChatJob:
    """An admitted chat request, as its Anthropic answer reads it."""

    answer: Answer
    opts: Options
    chosen: str | NamedToolChoice  # the effective tool choice
    readers: list[ToolCallReader] | None  # "auto" under a tool parser


def stop_reason(finish: str | None, stop: int | str | None, tool_used: bool,
                tool_complete: bool) -> tuple[StopReason | None, str | None]:
    """(stop_reason, stop_sequence): max_tokens wins; a matched stop string wins unless the
    tool calls are complete (a call it cut short must not run)."""
    if finish == "length":
        return "max_tokens", None
    if finish not in ("stop", "tool_calls"):
        return None, None
    if tool_complete:
        return "tool_use", None
    if isinstance(stop, str):  # a stop token id or the end of text is no stop sequence
        return "stop_sequence", stop
    if finish == "tool_calls" or tool_used:
        return "tool_use", None
    return "end_turn", None


def _input(arguments: str) -> dict[str, Any]:
    """A whole answer's tool call input; vLLM answers 400 when it is no JSON object (its
    arguments were cut by max_tokens)."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError as exc:
        raise bad_request(f"the tool call's arguments are not JSON ({exc}): raise "
                          "max_tokens", "max_tokens") from None
    if not isinstance(value, dict):
        raise bad_request("the tool call's arguments are not a JSON object", "max_tokens")
    return value


def _usage(job: ChatJob) -> AnthropicUsage:
    return AnthropicUsage(job.answer.num_prompt_tokens, job.answer.choices[0].stream.num_tokens)


def whole(job: ChatJob) -> AnthropicMessagesResponse:
    c = job.answer.choices[0]
    assert c.end is not None
    reader = job.readers[0] if job.readers else None
    choice = chat.whole(c, job.opts, job.chosen, "", reader)
    text, calls = choice.message.content, choice.message.tool_calls or []
    content: list[OutBlock] = [AnthropicTextBlock(text)] if text else []
    content += [AnthropicToolUseBlock(call.id, call.function.name,
                                      _input(call.function.arguments)) for call in calls]
    reason, sequence = stop_reason(choice.finish_reason, c.end.stop_reason, bool(calls),
                                   bool(calls))
    return AnthropicMessagesResponse(job.answer.id, "assistant",
                                     content or [AnthropicTextBlock("")], job.opts.model,
                                     reason, sequence, _usage(job))


def event(name: str, body: object) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + msgspec.json.encode(body) + b"\n\n"


def error_event(message: str) -> bytes:
    return event("error", AnthropicErrorResponse(AnthropicError("api_error", message)))


class _Blocks:
    """A stream's content blocks: one open at a time, numbered in order. Text that comes
    while a tool_use block is open follows it, in a text block of its own (vLLM's order)."""

    __slots__ = ("args", "frame", "index", "open", "pending", "tool_id", "tool_used")

    def __init__(self) -> None:
        self.index = 0  # the open block's, else the next one's
        self.open: str | None = None  # "text" | "tool_use"
        self.tool_id: str | None = None
        self.pending: list[str] = []
        self.frame: TextFrame | None = None
        self.tool_used = False
        self.args: list[str] = []  # the last tool_use block's input, as streamed

    def start(self, block: OutBlock) -> bytes:
        index = self.index
        if isinstance(block, AnthropicToolUseBlock):
            self.open, self.tool_id, self.tool_used, self.args = "tool_use", block.id, True, []
        else:
            self.open = "text"
            self.frame = TextFrame(
                lambda text: AnthropicBlockDelta(index, AnthropicTextDelta(text)),
                "content_block_delta")
        return event("content_block_start", AnthropicBlockStart(index, block))

    def text(self, text: str) -> list[bytes]:
        if not text:
            return []
        if self.open == "tool_use":
            self.pending.append(text)
            return []
        out = [] if self.open == "text" else [*self.close(), self.start(AnthropicTextBlock(""))]
        assert self.frame is not None
        out.append(self.frame(text))
        return out

    def json(self, piece: str) -> bytes:
        self.args.append(piece)
        return event("content_block_delta",
                     AnthropicBlockDelta(self.index, AnthropicJsonDelta(piece)))

    def tool(self, call_id: str, name: str, arguments: str | None) -> list[bytes]:
        out = [*self.close(), self.start(AnthropicToolUseBlock(call_id, name, {}))]
        return out + [self.json(arguments)] if arguments else out

    def _stop(self) -> list[bytes]:
        if self.open is None:
            return []
        out = event("content_block_stop", AnthropicBlockStop(self.index))
        self.open, self.tool_id, self.index = None, None, self.index + 1
        return [out]

    def close(self) -> list[bytes]:
        """Stop the open block, then write out the text held back behind it."""
        held, self.pending = "".join(self.pending), []
        out = self._stop()
        if held:
            out += [self.start(AnthropicTextBlock("")), *self.text(held), *self._stop()]
        return out

    @property
    def tool_complete(self) -> bool:
        if not self.tool_used:
            return False
        try:
            json.loads("".join(self.args))
        except json.JSONDecodeError:
            return False
        return True


class _Parsed:
    """A tool parser's deltas ("auto") as blocks: a call's id and name open its tool_use
    block, its arguments follow as input_json deltas."""

    def __init__(self, blocks: _Blocks) -> None:
        self.blocks = blocks
        self.ids: dict[int, str] = {}  # the calls' ids by their index

    def events(self, parsed: ParsedDelta | None) -> list[bytes]:
        if parsed is None:
            return []
        blocks = self.blocks
        out = blocks.text(parsed.content or "")
        for d in parsed.calls:
            if d.id is not None:
                self.ids[d.index] = d.id
                if blocks.tool_id != d.id and d.name is not None:
                    out += blocks.tool(d.id, d.name, d.arguments)
                    continue
            if d.arguments and blocks.tool_id is not None and \
                    blocks.tool_id == self.ids.get(d.index):
                out.append(blocks.json(d.arguments))
        return out


async def stream(job: ChatJob, scheduler: Scheduler) -> AsyncIterator[bytes]:
    answer, opts, chosen = job.answer, job.opts, job.chosen
    c = answer.choices[0]
    reader = job.readers[0] if job.readers else None
    blocks = _Blocks()
    parsed = _Parsed(blocks)
    named = chosen.function.name if isinstance(chosen, NamedToolChoice) else None
    try:
        # with the first output, as vLLM (clients time the first token from it)
        first: bytes | None = event("message_start", AnthropicMessageStart(AnthropicMessageHead(
            answer.id, opts.model, AnthropicUsage(answer.num_prompt_tokens, 0))))
        async for _, item in answer.outputs():
            if first is not None:
                yield first
                first = None
                if named is not None:  # a named tool's call is the whole answer
                    yield blocks.start(AnthropicToolUseBlock(tools.call_id(), named, {}))
            if isinstance(item, TokenDelta):
                c.take(item)
                if reader is not None:
                    for piece in parsed.events(reader.delta(item.text, item.token_ids, False)):
                        yield piece
                elif named is not None:
                    if item.text:
                        yield blocks.json(item.text)
                elif chosen != "required":
                    for piece in blocks.text(item.text):
                        yield piece
                continue
            for piece in _end(job, item, blocks, parsed):
                yield piece
    finally:
        answer.cancel_rest(scheduler)


def _end(job: ChatJob, end: JobEnd, blocks: _Blocks, parsed: _Parsed) -> list[bytes]:
    """The last events: a failed job's error, or the calls held back to the end, the open
    block's stop, message_delta (stop reason, usage) and message_stop."""
    c = job.answer.choices[0]
    c.end = end
    if end.error is not None:
        return [error_event(end.error)]
    out: list[bytes] = []
    if job.readers:  # the parser's last word (arguments it held back)
        out += parsed.events(job.readers[0].delta("", [], True))
    elif job.chosen == "required":  # the calls, once the array is complete
        for call in tools.calls("required", "".join(c.text)) or []:
            out += blocks.tool(call.id, call.function.name, call.function.arguments)
    out += blocks.close()
    reason, sequence = stop_reason(end.finish_reason or "stop", end.stop_reason,
                                   blocks.tool_used, blocks.tool_complete)
    out.append(event("message_delta", AnthropicMessageDelta(AnthropicStopDelta(reason, sequence),
                                                   _usage(job))))
    out.append(event("message_stop", AnthropicMessageStop()))
    return out
