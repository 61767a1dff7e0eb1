"""A Responses request -> what the chat route's job path takes: vLLM's checks (its 400s, in
its words), the conversation as chat messages (instructions, the stored history of
`previous_response_id`, the input items), the tools and tool choice in the chat shape, and
the sampling fields (as daemon.http.schemas.SamplingFields, so that translate.sampling_spec
and the admission checks treat them as a chat request's)."""

from __future__ import annotations

from daemon.http.errors import ApiError, bad_request
from daemon.http.responses_objects import OutputItem, OutputMessage
from daemon.http.responses_schemas import (
    REFUSED,
    ContentPart,
    InputItem,
    ResponsesRequest,
    ToolChoice,
    ToolChoiceObject,
)
from daemon.http.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    FunctionDefinition,
    JsonSchemaFormat,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    SamplingFields,
    Tool,
    ToolCall,
)
from daemon.http.schemas import (
    ContentPart as ChatPart,
)

_TEXT_PARTS = ("input_text", "output_text", "text", "reasoning_text", "summary_text")
_NOT_FOUND = "Tool choice 'function' not found in 'tools' parameter."


def check(req: ResponsesRequest) -> str | NamedToolChoice:
    """vLLM's request checks; the effective tool choice in the chat shape."""
    for name, why in REFUSED.items():
        if getattr(req, name) not in (None, False, "", [], {}):  # unless it asks nothing
            raise bad_request(f"{name!r}: {why}", name, "unsupported_parameter")
    if req.background and req.store is False:
        raise bad_request("background can only be used when `store` is true", "background")
    if req.previous_input_messages and req.previous_response_id:
        raise bad_request("Only one of `previous_input_messages` and `previous_response_id` "
                          "can be set.", "previous_response_id")
    if req.text is not None and req.text.format is not None and \
            req.structured_outputs is not None:
        raise bad_request("Cannot specify both structured_outputs and text.format",
                          "structured_outputs")
    if req.max_output_tokens is not None and req.max_output_tokens < 1:
        raise bad_request(f"max_output_tokens must be at least 1, got "
                          f"{req.max_output_tokens}.", "max_output_tokens")
    for i, tool in enumerate(req.tools):
        if tool.type != "function":
            raise bad_request(f"tools[{i}]: tool type {tool.type!r} is not supported (only "
                              "function tools: hosted tools need vLLM's tool server)",
                              f"tools[{i}].type")
        if not tool.name:
            raise bad_request(f"tools[{i}]: a function tool needs a name", f"tools[{i}].name")
    return _choice(req)


def _choice(req: ResponsesRequest) -> str | NamedToolChoice:
    wanted = req.tool_choice
    if not req.tools:  # vLLM's: without tools, "auto" means "none"
        if wanted in ("auto", "none"):
            return "none"
        if wanted == "required":
            raise bad_request("Tool choice 'required' must be specified with 'tools' "
                              "parameter.", "tool_choice")
        raise bad_request(_NOT_FOUND, "tool_choice")
    if isinstance(wanted, str):
        return wanted
    if wanted.type != "function":
        raise bad_request(f"tool_choice of type {wanted.type!r} is not supported (only "
                          "function tools)", "tool_choice")
    if not wanted.name or all(t.name != wanted.name for t in req.tools):
        raise bad_request(_NOT_FOUND, "tool_choice")
    return NamedToolChoice(function=NamedFunction(name=wanted.name))


def chat_tools(req: ResponsesRequest) -> list[Tool] | None:
    """The function tools as chat tools (what the template and the tool parser read)."""
    if not req.tools:
        return None
    return [Tool(function=FunctionDefinition(name=t.name or "", description=t.description,
                                             parameters=t.parameters, strict=t.strict))
            for t in req.tools]


def echoed_choice(chosen: str | NamedToolChoice) -> ToolChoice:
    """tool_choice as the response echoes it (vLLM: "none" without tools)."""
    if isinstance(chosen, NamedToolChoice):
        return ToolChoiceObject(type="function", name=chosen.function.name)
    assert chosen in ("none", "auto", "required")
    return chosen  # type: ignore[return-value]


# ---- the conversation --------------------------------------------------------------------

def conversation(req: ResponsesRequest, history: list[ChatMessage] | None,
                 previous_output: list[OutputItem] | None) -> list[ChatMessage]:
    """vLLM's construct_input_messages: the instructions, the previous response's messages
    without their system message (instructions do not carry over), its output text as
    assistant messages, then this request's input."""
    messages = [] if not req.instructions else \
        [ChatMessage(role="system", content=req.instructions)]
    messages += [m for m in history or [] if m.role != "system"]
    for out in previous_output or []:
        if isinstance(out, OutputMessage):  # function calls and reasoning are not kept
            messages += [ChatMessage(role="assistant", content=part.text)
                         for part in out.content]
    if isinstance(req.input, str):
        messages.append(ChatMessage(role="user", content=req.input))
        return messages
    start = len(messages)  # an input item joins an earlier input message only
    for i, item in enumerate(req.input):
        new = _message(item, i, messages[-1] if len(messages) > start else None)
        if new is not None:
            messages.append(new)
    if not messages:
        raise bad_request("'input' must hold at least one item (or instructions or a "
                          "previous response)", "input")
    return messages


def _text(parts: str | list[ContentPart] | None, where: str) -> str | None:
    if parts is None or isinstance(parts, str):
        return parts
    for k, part in enumerate(parts):
        if part.type not in _TEXT_PARTS and part.type != "refusal":
            raise bad_request(f"{where}.content[{k}]: only text parts are supported (the "
                              f"model is text-only), got {part.type!r}",
                              f"{where}.content[{k}]")
    return "".join(part.text or part.refusal or "" for part in parts)


def _message(item: InputItem, i: int, prev: ChatMessage | None) -> ChatMessage | None:
    """One input item as a chat message, or None where it joins the previous assistant
    message (vLLM's _construct_message_from_response_item)."""
    where = f"input[{i}]"
    kind = item.type or "message"
    assistant = prev if prev is not None and prev.role == "assistant" else None
    if kind == "function_call":
        return _call(item, where, assistant)
    if kind == "function_call_output":
        if item.call_id is None or item.output is None:
            raise bad_request(f"{where}: a function_call_output needs call_id and output",
                              where)
        return ChatMessage(role="tool", content=_text(item.output, where) or "",
                           tool_call_id=item.call_id)
    if kind == "reasoning":
        return _reasoning(item, where, assistant)
    if kind != "message" or item.role is None:
        raise bad_request(f"Unsupported input item type: {kind}", "input")
    if item.role == "assistant":
        text = item.content if isinstance(item.content, str) else \
            (_text(item.content[:1], where) if item.content else None)
        if text is None:  # vLLM passes such a message on as it is
            return ChatMessage(role="assistant")
        if assistant is not None and assistant.content is None:
            assistant.content = text
            return None
        return ChatMessage(role="assistant", content=text)
    text = _text(item.content, where)
    parts = None if text is None or isinstance(item.content, str) else \
        [ChatPart(type="text", text=text)]
    return ChatMessage(role=item.role, content=parts if parts is not None else text)


def _call(item: InputItem, where: str, assistant: ChatMessage | None) -> ChatMessage | None:
    if item.call_id is None or item.name is None or item.arguments is None:
        raise bad_request(f"{where}: a function_call needs call_id, name and arguments", where)
    name = f"{item.namespace}__{item.name}" if item.namespace else item.name
    call = ToolCall(id=item.call_id, function=FunctionCall(name=name,
                                                           arguments=item.arguments))
    if assistant is not None:
        assistant.tool_calls = [*(assistant.tool_calls or []), call]
        return None
    return ChatMessage(role="assistant", tool_calls=[call])


def _reasoning(item: InputItem, where: str, assistant: ChatMessage | None
               ) -> ChatMessage | None:
    if item.encrypted_content:
        raise bad_request("Encrypted content is not supported.", "input")
    parts = item.content if isinstance(item.content, list) and item.content else \
        (item.summary or [])
    text = parts[0].text or "" if parts else ""
    if assistant is not None and assistant.reasoning is None:
        assistant.reasoning = text
        return None
    return ChatMessage(role="assistant", reasoning=text)


def continues_final(req: ResponsesRequest) -> bool:
    """vLLM's should_continue_final_message: the last item is a message or reasoning left
    in progress or incomplete (the model continues it)."""
    if isinstance(req.input, str) or not req.input:
        return False
    last = req.input[-1]
    return (last.type or "message") in ("message", "reasoning") and \
        last.status in ("in_progress", "incomplete")


def chat_request(req: ResponsesRequest, messages: list[ChatMessage],
                 chosen: str | NamedToolChoice) -> ChatCompletionRequest:
    """The chat request this conversation is (what the chat template's options and vLLM's
    tool parser read)."""
    cont = continues_final(req)
    return ChatCompletionRequest(
        messages=messages, tools=chat_tools(req), tool_choice=chosen,  # type: ignore[arg-type]
        parallel_tool_calls=req.parallel_tool_calls, add_generation_prompt=not cont,
        continue_final_message=cont, chat_template_kwargs=req.chat_template_kwargs,
        reasoning_effort=req.reasoning.effort if req.reasoning else None,
        include_reasoning=req.include_reasoning, skip_special_tokens=req.skip_special_tokens)


def sampling_fields(req: ResponsesRequest) -> SamplingFields:
    """The request's sampling fields as the chat route's (vLLM's to_sampling_params: the
    same defaults; text.format is the response_format)."""
    fmt = req.text.format if req.text is not None else None
    response_format = None
    if fmt is not None and fmt.type == "json_object":
        response_format = ResponseFormat(type="json_object")
    elif fmt is not None and fmt.type == "json_schema" and fmt.schema is not None:
        response_format = ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(
            name=fmt.name or "response", schema=fmt.schema))
    return SamplingFields(
        model=req.model, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
        min_p=req.min_p, stream=req.stream, stop=req.stop or None, seed=req.seed,
        presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty, logit_bias=req.logit_bias,
        stop_token_ids=req.stop_token_ids, ignore_eos=req.ignore_eos,
        include_stop_str_in_output=req.include_stop_str_in_output,
        skip_special_tokens=req.skip_special_tokens, response_format=response_format,
        structured_outputs=req.structured_outputs, watermarking=req.watermarking,
        cache_salt=req.cache_salt, vllm_xargs=req.vllm_xargs,
        kv_transfer_params=req.kv_transfer_params, priority=req.priority)


def logprobs(req: ResponsesRequest) -> int | None:
    """Output logprobs are returned when `include` asks (top_logprobs candidates each)."""
    if not req.include or "message.output_text.logprobs" not in req.include:
        return None
    return req.top_logprobs or 0


def not_found(response_id: str) -> ApiError:
    """vLLM's 404 for an unknown (or evicted) response id."""
    return ApiError(404, f"Response with id '{response_id}' not found.",
                    "invalid_request_error", "response_id")

