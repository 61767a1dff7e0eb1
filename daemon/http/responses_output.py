"""A Responses answer's output as vLLM's server writes it: the output items of a whole answer
(one message, or what vLLM's tool parser finds: a message for the content and one
function_call item per call), usage, and the typed stream events with their sequence
numbers (response.created, response.in_progress, then per item output_item.added,
content_part.added, output_text.delta ..., output_text.done, content_part.done,
output_item.done, and response.completed), framed as `event: TYPE` + `data: JSON`."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import msgspec

from daemon.core.stream import Position
from daemon.http import logprobs as lp
from daemon.http.responses_objects import (
    ArgumentsDelta,
    ArgumentsDone,
    Completed,
    Created,
    ErrorEvent,
    Event,
    FunctionCallItem,
    InProgress,
    InputTokensDetails,
    ItemAdded,
    ItemDone,
    Logprob,
    OutputItem,
    OutputMessage,
    OutputText,
    OutputTokensDetails,
    PartAdded,
    PartDone,
    ResponseObject,
    ResponseUsage,
    StreamLogprob,
    TextDelta,
    TextDone,
    TopLogprob,
)
from daemon.toolcalls import CallDelta, ParsedCall, ParsedDelta


def new_id(prefix: str) -> str:
    """vLLM's ids: a prefix and 16 hex digits (resp_, msg_, fc_)."""
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


def usage(input_tokens: int, output_tokens: int) -> ResponseUsage:
    return ResponseUsage(input_tokens, InputTokensDetails(), output_tokens,
                         OutputTokensDetails(), input_tokens + output_tokens)


def logprobs(token_ids: Sequence[int], positions: Sequence[Position | None],
             shape: lp.Shape | None) -> list[Logprob] | None:
    if shape is None:
        return None
    return [Logprob(c.token, c.logprob, c.bytes or [],
                    [TopLogprob(t.token, t.logprob, t.bytes or []) for t in c.top_logprobs])
            for c in lp.chat(token_ids, positions, shape).content or []]


def whole(text: str, calls: list[ParsedCall] | None, parsed: bool,
          logprob_list: list[Logprob] | None) -> list[OutputItem]:
    """The items of a whole answer. `parsed`: the server has a tool parser or the choice
    constrained the answer to calls (vLLM then writes a message only for non-empty
    content); otherwise the answer is one message, empty or not."""
    if not parsed:
        content = [OutputText(text, logprobs=logprob_list)] if text else []
        return [OutputMessage(new_id("msg"), content)]
    items: list[OutputItem] = []
    if text:
        items.append(OutputMessage(new_id("msg"), [OutputText(text, logprobs=logprob_list)]))
    items += [FunctionCallItem(new_id("fc"), c.id, c.name, c.arguments) for c in calls or []]
    return items


def _stream_logprobs(items: list[Logprob] | None) -> list[StreamLogprob]:
    return [StreamLogprob(x.token, x.logprob,
                          [{"token": t.token, "logprob": t.logprob} for t in x.top_logprobs])
            for x in items or []]


_MARK_TEXT, _MARK_SEQ = "\x00text", 987654321987


class Events:
    """One streamed answer's events, numbered in order from 0 (vLLM's state machine: a
    message opens at its first non-empty text, a function call at its first delta, and
    the open item closes when another kind of output or another call begins)."""

    def __init__(self) -> None:
        self.sequence = 0
        self.output_index = 0
        self.items: list[OutputItem] = []  # closed items, in order (the final output)
        self._kind: str | None = None  # "text" | "call" | None
        self._item_id = ""
        self._text: list[str] = []
        self._logprobs: list[Logprob] = []
        self._call: CallDelta | None = None
        self._call_index: int | None = None
        self._frame: tuple[bytes, bytes, bytes] | None = None

    def event(self, ev: Event) -> bytes:
        ev.sequence_number = self.sequence
        self.sequence += 1
        kind = type(ev).__struct_config__.tag
        return b"event: %s\ndata: %s\n\n" % (str(kind).encode(), msgspec.json.encode(ev))

    def head(self, response: ResponseObject) -> bytes:
        return self.event(Created(response, 0)) + self.event(InProgress(response, 0))

    def completed(self, response: ResponseObject) -> bytes:
        return self.event(Completed(response, 0))

    def error(self, message: str) -> bytes:
        return self.event(ErrorEvent(message, "server_error", None, 0))

    # ---- text ----------------------------------------------------------------------------

    def text(self, delta: str, logprob_list: list[Logprob] | None = None) -> bytes:
        """A piece of the answer's text (nothing for an empty one)."""
        if not delta:
            return b""
        out = b"" if self._kind == "text" else self.close() + self._open_text()
        self._text.append(delta)
        if logprob_list:
            self._logprobs += logprob_list
            return out + self.event(TextDelta(0, delta, self._item_id,
                                              _stream_logprobs(logprob_list),
                                              self.output_index, 0))
        return out + self._text_frame(delta)

    def _text_frame(self, delta: str) -> bytes:
        """A text-only delta framed around its encoded text and number (the rest of the
        event is encoded once per item)."""
        if self._frame is None:
            mark = TextDelta(0, _MARK_TEXT, self._item_id, [], self.output_index, _MARK_SEQ)
            raw = b"event: response.output_text.delta\ndata: %s\n\n" % msgspec.json.encode(mark)
            head, _, rest = raw.partition(msgspec.json.encode(_MARK_TEXT))
            key = b'"sequence_number":'
            mid, _, tail = rest.partition(key + b"%d" % _MARK_SEQ)
            self._frame = (head, mid + key, tail)
        head, mid, tail = self._frame
        number = self.sequence
        self.sequence += 1
        return b"%s%s%s%d%s" % (head, msgspec.json.encode(delta), mid, number, tail)

    def _open_text(self) -> bytes:
        self._kind, self._item_id = "text", new_id("msg")
        self._text, self._logprobs, self._frame = [], [], None
        return (self.event(ItemAdded(OutputMessage(self._item_id, [], status="in_progress"),
                                     self.output_index, 0))
                + self.event(PartAdded(0, self._item_id, self.output_index,
                                       OutputText("", logprobs=[]), 0)))

    def _close_text(self) -> bytes:
        text = "".join(self._text)
        part = OutputText(text, logprobs=self._logprobs or None)
        item = OutputMessage(self._item_id, [part] if text else [])
        return (self.event(TextDone(0, self._item_id, [], self.output_index, 0, text))
                + self.event(PartDone(0, self._item_id, self.output_index, part, 0))
                + self._item_done(item))

    def _item_done(self, item: OutputItem) -> bytes:
        self.items.append(item)
        out = self.event(ItemDone(item, self.output_index, 0))
        self.output_index += 1
        self._kind = None
        return out

    # ---- tool calls ----------------------------------------------------------------------

    def parsed(self, delta: ParsedDelta | None, first_only: bool) -> bytes:
        """What a tool parser made of new tokens: content, then calls grouped by index
        (vLLM's split_delta); `first_only`: parallel_tool_calls is false."""
        if delta is None:
            return b""
        out = self.text(delta.content) if delta.content else b""
        groups: dict[int, list[CallDelta]] = {}
        for call in delta.calls:
            if not first_only or call.index == 0:
                groups.setdefault(call.index, []).append(call)
        for index, calls in groups.items():
            out += self._call_delta(index, calls)
        return out

    def _call_delta(self, index: int, calls: list[CallDelta]) -> bytes:
        first = calls[0]
        if first.name is None and first.arguments is None:
            return b""
        out = b""
        if self._kind != "call" or self._call_index != index:
            out = self.close() + self._open_call(first, index)
        arguments = "".join(c.arguments or "" for c in calls)
        if arguments:
            self._text.append(arguments)
            out += self.event(ArgumentsDelta(arguments, self._item_id, self.output_index, 0))
        return out

    def _open_call(self, call: CallDelta, index: int) -> bytes:
        self._kind, self._item_id, self._call_index = "call", new_id("fc"), index
        self._call, self._text = call, []
        item = FunctionCallItem(self._item_id, call.id or new_id("call"), call.name or "",
                                "", status="in_progress")
        return self.event(ItemAdded(item, self.output_index, 0))

    def _close_call(self) -> bytes:
        assert self._call is not None
        arguments = "".join(self._text)
        name = self._call.name or ""
        item = FunctionCallItem(self._item_id, self._call.id or new_id("call"), name,
                                arguments)
        return (self.event(ArgumentsDone(arguments, self._item_id, name, self.output_index, 0))
                + self._item_done(item))

    def calls(self, calls: list[ParsedCall]) -> bytes:
        """Whole calls (a constrained answer, complete at its end): each one's events."""
        out = b""
        for index, call in enumerate(calls):
            out += self._call_delta(index, [CallDelta(index, call.id, call.name,
                                                      call.arguments)])
        return out

    def close(self) -> bytes:
        """Close the open item, if any."""
        if self._kind == "text":
            return self._close_text()
        if self._kind == "call":
            return self._close_call()
        return b""

