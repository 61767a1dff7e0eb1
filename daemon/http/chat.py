"""/v1/chat/completions' own parts: vLLM's checks, the chat template's options (tools,
documents, chat_template_kwargs, add_generation_prompt, continue_final_message, reasoning
effort), echo, tool calls in the answer, the body's choices and the SSE chunks (routes.py
admits the jobs)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from daemon.core.scheduler import Scheduler
from daemon.core.stream import JobEnd, TokenDelta
from daemon.http import render, tools, translate
from daemon.http.render import Answer, Choice, Options
from daemon.http.responses import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatMessageOut,
    Delta,
    FunctionCallOut,
    ToolCallDelta,
    ToolCallOut,
)
from daemon.http.schemas import ChatCompletionRequest, NamedToolChoice
from daemon.toolcalls import ParsedDelta, ToolCallReader


def template_options(req: Any) -> dict[str, Any]:
    """The chat template's options a chat or tokenize request carries (vLLM's meaning)."""
    kwargs = dict(req.chat_template_kwargs or {})
    effort = getattr(req, "reasoning_effort", None)
    if effort is not None:
        kwargs.setdefault("reasoning_effort", effort)
        kwargs.setdefault("enable_thinking", effort != "none")
    if req.continue_final_message and req.add_generation_prompt and \
            "add_generation_prompt" in req.__struct_fields__:
        raise translate.bad_request("Cannot set both `continue_final_message` and "
                                    "`add_generation_prompt` to True.",
                                    "continue_final_message")
    return {"add_generation_prompt": req.add_generation_prompt,
            "continue_final_message": req.continue_final_message,
            "tools": tools.template_tools(req) if req.tools else None,
            "documents": getattr(req, "documents", None), "template_kwargs": kwargs}


def check(req: ChatCompletionRequest, parser: str) -> str | NamedToolChoice:
    """vLLM's checks of a chat request; the effective tool choice."""
    translate.check_request(req, bool(req.stream))
    if req.top_logprobs and not req.logprobs:
        raise translate.bad_request("when using `top_logprobs`, `logprobs` must be set to "
                                    "true.", "top_logprobs")
    if req.logprob_token_ids and not req.logprobs:
        raise translate.bad_request("when using `logprob_token_ids`, `logprobs` must be set "
                                    "to true.", "logprob_token_ids")
    return tools.choice(req, parser)


def echo_text(req: ChatCompletionRequest) -> str:
    """echo: the last message's text goes before the answer when it is the assistant's."""
    last = req.messages[-1] if req.messages else None
    if not req.echo or last is None or last.role != "assistant":
        return ""
    if isinstance(last.content, list):
        return "\n".join(part.text or "" for part in last.content)
    return last.content or ""


def _finish(end: JobEnd, chosen: str | NamedToolChoice, called: bool) -> str | None:
    if chosen == "required" and called and end.finish_reason == "stop":
        return "tool_calls"
    return end.finish_reason


def _auto_whole(c: Choice, opts: Options, echo: str, reader: ToolCallReader) -> ChatChoice:
    """tool_choice "auto" with a tool parser: the calls it finds, the rest as content."""
    assert c.end is not None
    content, parsed = reader.whole("".join(c.text), c.token_ids)
    calls = [ToolCallOut(p.id, FunctionCallOut(p.name, p.arguments)) for p in parsed]
    text = echo + (content or "") if echo or content is not None else None
    message = ChatMessageOut("assistant", text, calls or msgspec.UNSET)
    # vLLM's: an answer that called a tool finished for it, whatever ended it
    return render.chat_choice(c, opts, message, "tool_calls" if calls else c.end.finish_reason)


def _call_deltas(parsed: ParsedDelta) -> list[ToolCallDelta] | None:
    return [ToolCallDelta(d.index, d.id, "function" if d.id else None,
                          {k: v for k, v in (("name", d.name), ("arguments", d.arguments))
                           if v is not None})
            for d in parsed.calls] or None


def _auto_piece(c: Choice, opts: Options, delta: TokenDelta, parsed: ParsedDelta | None,
                finish: str | None = None, stop_reason: int | str | None = None
                ) -> ChatChunkChoice | None:
    """A streamed piece under a tool parser (vLLM's rule: the parser may hold text back; a
    delta with nothing to say still goes when it carries logprobs or token ids)."""
    if parsed is None and finish is None and opts.logprobs is None \
            and not opts.return_token_ids:
        return None
    message = Delta() if parsed is None else \
        Delta(content=parsed.content, tool_calls=_call_deltas(parsed))
    logprobs = render.chat_logprobs(c, opts, delta.token_ids, delta.logprobs or []) \
        if delta.token_ids else None
    return ChatChunkChoice(c.index, message, finish, logprobs, stop_reason,
                           delta.token_ids if opts.return_token_ids else None)


def whole(c: Choice, opts: Options, chosen: str | NamedToolChoice, echo: str,
          reader: ToolCallReader | None = None) -> ChatChoice:
    if reader is not None:
        return _auto_whole(c, opts, echo, reader)
    assert c.end is not None
    text = echo + "".join(c.text)
    calls = tools.calls(chosen, "".join(c.text))
    message = ChatMessageOut("assistant", text) if not calls else \
        ChatMessageOut("assistant", "", calls)
    return render.chat_choice(c, opts, message, _finish(c.end, chosen, bool(calls)))


async def stream(answer: Answer, opts: Options, chosen: str | NamedToolChoice, echo: str,
                 scheduler: Scheduler, readers: list[ToolCallReader] | None = None
                 ) -> AsyncIterator[bytes]:
    created = int(time.time())
    constrained = chosen == "required" or isinstance(chosen, NamedToolChoice)
    called = [False] * len(answer.choices)  # "auto": a tool call delta went out

    def chunk(choices: list[ChatChunkChoice], final_usage: bool = False) -> bytes:
        usage = render.usage(answer.choices, answer.num_prompt_tokens) \
            if opts.continuous_usage or final_usage else None
        return render.sse(ChatCompletionChunk(answer.id, created, opts.model, choices, usage))

    # A delta with text only (no logprobs, token ids, usage, tool call) is framed cheaply.
    plain = None if constrained or readers is not None or opts.logprobs is not None or \
        opts.return_token_ids or opts.continuous_usage else render.TextFrame(
            lambda text: ChatCompletionChunk(answer.id, created, opts.model,
                                             [ChatChunkChoice(0, Delta(content=text))]))
    try:
        # The role chunk first, with the first output as vLLM does: clients time TTFT from
        # the first chunk, so it must not leave before the engine's first token.
        head = ChatCompletionChunk(
            answer.id, created, opts.model,
            [ChatChunkChoice(c.index, Delta(role="assistant", content=echo))
             for c in answer.choices],
            render.usage(answer.choices, answer.num_prompt_tokens)
            if opts.continuous_usage else None,
            prompt_token_ids=answer.choices[0].prompt_ids if opts.return_token_ids else None)
        first: bytes | None = render.sse(head)
        async for c, item in answer.outputs():
            if first is not None:
                yield first
                first = None
            if isinstance(item, TokenDelta):
                c.take(item)
                if plain is not None and c.index == 0:
                    if item.text:
                        yield plain(item.text)
                    continue
                if readers is not None:
                    parsed = readers[c.index].delta(item.text, item.token_ids, False)
                    called[c.index] |= bool(parsed and parsed.calls)
                    piece = _auto_piece(c, opts, item, parsed)
                else:
                    piece = None if constrained else render.chat_piece(c, opts, item)
                if piece is not None:
                    yield chunk([piece])
                continue
            c.end = item
            if item.error is not None:
                yield render.error_event(item.error)
                continue
            if readers is not None:  # the parser's last word (arguments it held back)
                parsed = readers[c.index].delta("", [], True)
                called[c.index] |= bool(parsed and parsed.calls)
                finish = "tool_calls" if called[c.index] and item.finish_reason == "stop" \
                    else item.finish_reason
                last = _auto_piece(c, opts, TokenDelta("", [], []), parsed, finish,
                                   item.stop_reason)
                yield chunk([last] if last is not None else [])
                continue
            calls = tools.calls(chosen, "".join(c.text)) if constrained else None
            if calls:  # a constrained answer is one tool call delta, once complete
                yield chunk([ChatChunkChoice(c.index, Delta(tool_calls=[
                    ToolCallDelta(i, call.id, "function", {"name": call.function.name,
                                                           "arguments": call.function.arguments})
                    for i, call in enumerate(calls)]))])
            yield chunk([ChatChunkChoice(c.index, Delta(), _finish(item, chosen, bool(calls)),
                                         stop_reason=item.stop_reason)])
        if opts.include_usage:
            yield chunk([], final_usage=True)
        yield b"data: [DONE]\n\n"
    finally:
        answer.cancel_rest(scheduler)
