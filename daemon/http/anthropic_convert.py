"""An Anthropic Messages request as the chat request it means, as vLLM's Anthropic server
converts it (`AnthropicServingMessages.to_chat_completion_request`): the system prompt first,
content blocks as chat messages (tool_use -> the assistant's tool calls, a user's
tool_result -> a `tool` message before the user's own text, thinking -> reasoning),
Anthropic's tool choice and tools (with tool_addition / tool_removal applied), thinking and
output_config as reasoning effort, budget and JSON schema. The chat request then takes the
chat route's one path to a job (Routes.admit_chat).

Bad input gets the Anthropic route's 400 naming the field, in this module's words where vLLM
would give a validation error; what lengthwise cannot serve (images on a text-only model)
is refused here too."""

from __future__ import annotations

import json
import time
from typing import Any

import msgspec

from daemon.http import translate
from daemon.http.anthropic_schemas import (
    AnthropicContentBlock,
    AnthropicMessage,
    AnthropicMessagesRequest,
    AnthropicPrompt,
    AnthropicThinkingDisabled,
    AnthropicThinkingEnabled,
    AnthropicTool,
    AnthropicToolDefinition,
)
from daemon.http.errors import ApiError
from daemon.http.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    ContentPart,
    FunctionCall,
    FunctionDefinition,
    JsonSchemaFormat,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    ToolCall,
)
from daemon.http.schemas import Tool as ChatTool

# Claude Code's attribution header: a per-request hash that would defeat prefix caching.
_BILLING = "x-anthropic-billing-header"
_TOOL_CHANGES = ("tool_addition", "tool_removal")


def _bad(message: str, param: str) -> ApiError:
    return translate.bad_request(message, param)


def to_chat(req: AnthropicPrompt, *, merge_inline_system: bool, disabled_effort: str
            ) -> ChatCompletionRequest:
    """The chat request `req` means. `merge_inline_system`: the template takes a system
    message only first, so later ones join the first; `disabled_effort`: the reasoning effort
    that `thinking: disabled` stands for with this template."""
    _check(req)
    messages = _system(req, merge_inline_system)
    for i, msg in enumerate(req.messages):
        messages += _message(msg, i, merge_inline_system)
    chat = ChatCompletionRequest(model=req.model, messages=messages,
                                 chat_template_kwargs=req.chat_template_kwargs)
    if isinstance(req, AnthropicMessagesRequest):
        _sampling(chat, req)
    _output_config(chat, req)
    if isinstance(req.thinking, AnthropicThinkingDisabled):
        chat.reasoning_effort = disabled_effort  # type: ignore[assignment]
    elif isinstance(req.thinking, AnthropicThinkingEnabled):
        chat.thinking_token_budget = req.thinking.budget_tokens
    _tools(chat, req)
    return chat


def _check(req: AnthropicPrompt) -> None:
    """vLLM's request validators that no field's type can say."""
    choice = req.tool_choice
    if choice is not None and choice.type == "tool" and not choice.name:
        raise _bad("tool_choice.name is required when type is 'tool'", "tool_choice.name")
    if isinstance(req.system, list):
        for j, block in enumerate(req.system):
            if block.type in _TOOL_CHANGES:
                raise _bad(f'{block.type} blocks are only allowed in messages with role '
                           '"system"', f"system[{j}]")
    thinking = req.thinking
    if isinstance(req, AnthropicMessagesRequest) and \
            isinstance(thinking, AnthropicThinkingEnabled) and \
            not (req.kv_transfer_params or {}).get("do_remote_decode") and \
            thinking.budget_tokens >= req.max_tokens:
        raise _bad("thinking.budget_tokens must be less than max_tokens",
                   "thinking.budget_tokens")
    for i, msg in enumerate(req.messages):
        for j, block in enumerate(msg.content if isinstance(msg.content, list) else ()):
            where = f"messages[{i}].content[{j}]"
            if block.type in _TOOL_CHANGES and msg.role != "system":
                raise _bad(f'{block.type} blocks are only allowed in messages with role '
                           '"system"', where)
            if block.type in _TOOL_CHANGES and block.tool is None:
                raise _bad(f"tool is required for {block.type} blocks", where)
            if block.type == "tool_removal" and isinstance(block.tool, AnthropicToolDefinition):
                raise _bad("tool_removal only accepts a tool_reference", where)


def _system_text(content: str | list[AnthropicContentBlock]) -> str:
    if isinstance(content, str):
        return "" if content.startswith(_BILLING) else content
    return "".join(b.text for b in content
                   if b.type == "text" and b.text and not b.text.startswith(_BILLING))


def _system(req: AnthropicPrompt, merge: bool) -> list[ChatMessage]:
    """The leading system message: the request's `system`, with the inline system messages
    when the template takes none later."""
    parts = [_system_text(req.system)] if req.system else []
    if merge:
        parts += [_system_text(m.content) for m in req.messages if m.role == "system"]
    text = "".join(parts)
    return [ChatMessage(role="system", content=text)] if text else []


def _message(msg: AnthropicMessage, i: int, merge: bool) -> list[ChatMessage]:
    """One Anthropic message as chat messages: a user's tool results come first, each a
    `tool` message; a user message with nothing but tool results is left out."""
    if msg.role == "system":
        text = "" if merge else _system_text(msg.content)
        return [ChatMessage(role="system", content=text)] if text else []
    if isinstance(msg.content, str):
        return [ChatMessage(role=msg.role, content=msg.content)]
    before: list[ChatMessage] = []
    parts: list[ContentPart] = []
    calls: list[ToolCall] = []
    reasoning: list[str] = []
    for j, block in enumerate(msg.content):
        where = f"messages[{i}].content[{j}]"
        if block.type == "text" and block.text:
            parts.append(ContentPart(type="text", text=block.text))
        elif block.type == "image":
            raise _bad("image blocks need a multimodal model; this one is text-only", where)
        elif block.type == "thinking" and block.thinking is not None:
            reasoning.append(block.thinking)
        elif block.type == "tool_use":
            calls.append(ToolCall(id=block.id or f"call_{int(time.time())}", function=FunctionCall(
                name=block.name or "", arguments=json.dumps(block.input or {}))))
        elif block.type == "tool_result" and msg.role == "user":
            before.append(_tool_result(block, where))
        elif block.type == "tool_result":  # in an assistant's message: text, as vLLM
            shown = str(block.content) if block.content else ""
            parts.append(ContentPart(type="text", text=f"Tool result: {shown}"))
    out = ChatMessage(role=msg.role, tool_calls=calls or None,
                      reasoning="".join(reasoning) if reasoning else None)
    if len(parts) == 1:
        out.content = parts[0].text
    elif parts:
        out.content = parts
    if msg.role == "user" and not parts:
        return before
    return [*before, out]


def _tool_result(block: AnthropicContentBlock, where: str) -> ChatMessage:
    """A user's tool_result as a `tool` message: its text items, one per line."""
    text = ""
    if isinstance(block.content, str):
        text = block.content
    elif isinstance(block.content, list):
        texts = []
        for item in block.content:
            kind = item.get("type")
            if kind == "text":
                texts.append(str(item.get("text", "")))
            elif kind in ("image", "tool_reference"):
                raise _bad(f"{kind} items in a tool_result need a model whose template "
                           "takes them; this one is text-only", f"{where}.content")
        text = "\n".join(texts)
    return ChatMessage(role="tool", tool_call_id=block.tool_use_id or "", content=text)


def _sampling(chat: ChatCompletionRequest, req: AnthropicMessagesRequest) -> None:
    chat.max_tokens = chat.max_completion_tokens = req.max_tokens
    chat.stop = req.stop_sequences
    chat.temperature, chat.top_p, chat.top_k = req.temperature, req.top_p, req.top_k
    chat.stream = req.stream
    chat.watermarking, chat.cache_salt = req.watermarking, req.cache_salt
    chat.kv_transfer_params, chat.ec_transfer_params = req.kv_transfer_params, \
        req.ec_transfer_params
    chat.vllm_xargs, chat.priority = req.vllm_xargs, req.priority


def _output_config(chat: ChatCompletionRequest, req: AnthropicPrompt) -> None:
    config = req.output_config
    if config is None:
        return
    if config.format is not None and config.format.schema:
        chat.response_format = ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(
            name=config.format.type, schema=config.format.schema))
    if config.effort is not None:
        chat.reasoning_effort = config.effort


def _tools(chat: ChatCompletionRequest, req: AnthropicPrompt) -> None:
    choice = req.tool_choice
    if choice is not None:
        chat.parallel_tool_calls = not choice.disable_parallel_tool_use
        named = choice.type == "tool" and choice.name
        chat.tool_choice = NamedToolChoice(function=NamedFunction(name=choice.name)) \
            if named and choice.name else {"auto": "auto", "any": "required",
                                           "none": "none"}.get(choice.type)  # type: ignore
    tools = _resolve_tools(req)
    if tools is None:
        return
    chat.tools = [ChatTool(function=FunctionDefinition(
        name=t.name, description=t.description, parameters=_schema(t.input_schema),
        strict=t.strict), defer_loading=t.defer_loading) for t in tools]
    if chat.tool_choice is None:
        chat.tool_choice = "auto"


def _schema(schema: dict[str, Any]) -> dict[str, Any]:
    """An input schema without a type is an object's (vLLM's default, added last)."""
    return schema if "type" in schema else {**schema, "type": "object"}


def _resolve_tools(req: AnthropicPrompt) -> list[AnthropicTool] | None:
    """The tools in effect at the conversation's end (chat templates see one list): a tool
    added by value is declared, one added by reference no longer deferred, a removed one
    dropped."""
    changes = [(i, j, b) for i, m in enumerate(req.messages) if isinstance(m.content, list)
               for j, b in enumerate(m.content) if b.type in _TOOL_CHANGES]
    if not changes:
        return req.tools
    tools = {t.name: t for t in req.tools or []}
    removed: set[str] = set()
    for i, j, block in changes:
        change = block.tool
        if isinstance(change, AnthropicToolDefinition):
            name = change.definition.name
            tools[name] = change.definition
        else:
            assert change is not None  # _check
            name = change.name
            if name not in tools:
                raise _bad(f"{block.type} references tool {name!r}, which is not declared "
                           "in tools", f"messages[{i}].content[{j}]")
            if block.type == "tool_addition":
                tools[name] = msgspec.structs.replace(tools[name], defer_loading=None)
        if block.type == "tool_removal":
            removed.add(name)
        else:
            removed.discard(name)
    return [t for name, t in tools.items() if name not in removed]


def template_probe(render: Any) -> tuple[bool, str]:
    """(merge_inline_system, disabled_effort) for this chat template, as vLLM decides them:
    a template that refuses a system message after the first one gets them merged; one that
    renders "none" as it renders some effort cannot turn thinking off, so "disabled" asks
    for "low". `render(messages, effort)` is the template's text, None if it refuses."""
    turn = [{"role": "user", "content": "t"}]
    merge = render([{"role": "system", "content": "t"}, *turn,
                    {"role": "system", "content": "t"}, *turn], None, False) is None
    hi = [{"role": "user", "content": "Hi"}]
    none = render(hi, "none", True)
    if none is None or any(render(hi, effort, True) == none
                           for effort in ("low", "medium", "high", "xhigh", "max")):
        return merge, "low"
    return merge, "none"
