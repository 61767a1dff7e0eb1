"""Anthropic's Messages API bodies (msgspec), with vLLM's fields: vLLM's Anthropic server
(`vllm/entrypoints/anthropic/protocol.py`, the pinned version) is the contract, field for
field (tests/http/test_schemas.py reads its request models).

The request's own fields are checked as strictly as the OpenAI bodies (an unknown one is a
400 naming it); content blocks are lenient, as in vLLM, because Anthropic's clients send
fields there that change nothing for a served model (`cache_control`, `citations`, ...).
Responses and stream events are shaped as vLLM's server writes them: a non-streamed message
leaves out what is null, an event leaves out what vLLM does not set."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from daemon.http.schemas import StopString, TopP, Xarg

BlockType = Literal["text", "image", "tool_use", "tool_result", "tool_reference", "thinking",
                    "redacted_thinking", "tool_addition", "tool_removal"]
StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]
Effort = Literal["low", "medium", "high", "xhigh", "max"]


class _Body(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class AnthropicTool(_Body, kw_only=True):
    name: Annotated[str, msgspec.Meta(min_length=1)]
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool | None = None
    defer_loading: bool | None = None
    # Anthropic's, sent by its clients; no meaning for a served model
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None


class AnthropicToolReference(_Body, kw_only=True, tag="tool_reference", tag_field="type"):
    name: str


class AnthropicToolDefinition(_Body, kw_only=True, tag="tool_definition",
                              tag_field="type"):
    definition: AnthropicTool


class AnthropicContentBlock(msgspec.Struct, kw_only=True):
    """One block of a message (or of the system prompt): every kind vLLM takes."""

    type: BlockType
    text: str | None = None
    source: dict[str, Any] | None = None  # image
    id: str | None = None  # tool_use
    tool_use_id: str | None = None  # tool_result
    name: str | None = None
    input: dict[str, Any] | None = None
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None
    tool_name: str | None = None  # tool_reference
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None  # redacted_thinking
    # tool_addition, tool_removal
    tool: AnthropicToolReference | AnthropicToolDefinition | None = None


class AnthropicMessage(_Body, kw_only=True):
    role: Literal["user", "assistant", "system"]
    content: str | list[AnthropicContentBlock]


class AnthropicToolChoice(_Body, kw_only=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class AnthropicJsonOutputFormat(_Body, kw_only=True):
    type: Literal["json_schema"] = "json_schema"
    schema: dict[str, Any] | None = None


class AnthropicOutputConfig(_Body, kw_only=True):
    effort: Effort | None = None
    format: AnthropicJsonOutputFormat | None = None


class AnthropicThinkingEnabled(_Body, kw_only=True, tag="enabled", tag_field="type"):
    budget_tokens: Annotated[int, msgspec.Meta(ge=1024)]
    display: Literal["summarized", "omitted", "updates"] | None = None  # ignored, as vLLM


class AnthropicThinkingDisabled(_Body, kw_only=True, tag="disabled", tag_field="type"):
    pass


class AnthropicThinkingAdaptive(_Body, kw_only=True, tag="adaptive", tag_field="type"):
    display: Literal["summarized", "omitted", "updates"] | None = None


Thinking = AnthropicThinkingEnabled | AnthropicThinkingDisabled | AnthropicThinkingAdaptive


class AnthropicPrompt(_Body, kw_only=True):
    """What both endpoints render into the chat template's prompt."""

    model: Annotated[str, msgspec.Meta(min_length=1)]
    messages: list[AnthropicMessage]
    system: str | list[AnthropicContentBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: Thinking | None = None
    output_config: AnthropicOutputConfig | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's


class AnthropicMessagesRequest(AnthropicPrompt, kw_only=True):
    max_tokens: Annotated[int, msgspec.Meta(ge=1)]
    stop_sequences: list[StopString] | None = None
    stream: bool | None = False
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=2.0)] | None = None
    top_p: TopP | None = None
    top_k: Annotated[int, msgspec.Meta(ge=-1)] | None = None
    # Anthropic's, sent by its client where asked; no meaning for a served model (as vLLM,
    # which ignores every field it does not know)
    metadata: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None
    service_tier: str | None = None
    inference_geo: str | None = None
    speed: str | None = None
    # vLLM's extensions
    cache_salt: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)] | None = None
    watermarking: bool | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None  # refused unless empty (as chat)
    vllm_xargs: dict[str, Xarg] | None = None
    mm_payload: Literal["tensors", "none"] = "tensors"  # render endpoints only: ignored
    return_mm_kwargs: bool | None = None
    # lengthwise's, as on the OpenAI routes: lower is more urgent
    priority: Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)] = 0


class AnthropicCountTokensRequest(AnthropicPrompt, kw_only=True):
    pass


# ---- responses ---------------------------------------------------------------------------

class AnthropicUsage(msgspec.Struct):
    input_tokens: int
    output_tokens: int


class AnthropicTextBlock(msgspec.Struct, tag="text", tag_field="type"):
    text: str


class AnthropicToolUseBlock(msgspec.Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: dict[str, Any]


OutBlock = AnthropicTextBlock | AnthropicToolUseBlock


class AnthropicMessagesResponse(msgspec.Struct, omit_defaults=True, tag="message",
                                tag_field="type"):
    """A whole answer (vLLM drops its null fields)."""

    id: str
    role: str  # "assistant"
    content: list[OutBlock]
    model: str
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: AnthropicUsage | None = None


class AnthropicMessageHead(msgspec.Struct, tag="message", tag_field="type"):
    """message_start's message: nulls written out (strict clients read them)."""

    id: str
    model: str
    usage: AnthropicUsage
    role: str = "assistant"
    content: list[OutBlock] = []
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None


class AnthropicMessageStart(msgspec.Struct, tag="message_start", tag_field="type"):
    message: AnthropicMessageHead


class AnthropicBlockStart(msgspec.Struct, tag="content_block_start", tag_field="type"):
    index: int
    content_block: OutBlock


class AnthropicTextDelta(msgspec.Struct, tag="text_delta", tag_field="type"):
    text: str


class AnthropicJsonDelta(msgspec.Struct, tag="input_json_delta", tag_field="type"):
    partial_json: str


class AnthropicBlockDelta(msgspec.Struct, tag="content_block_delta", tag_field="type"):
    index: int
    delta: AnthropicTextDelta | AnthropicJsonDelta


class AnthropicBlockStop(msgspec.Struct, tag="content_block_stop", tag_field="type"):
    index: int


class AnthropicStopDelta(msgspec.Struct):
    stop_reason: StopReason | None
    stop_sequence: str | None


class AnthropicMessageDelta(msgspec.Struct, tag="message_delta", tag_field="type"):
    delta: AnthropicStopDelta
    usage: AnthropicUsage


class AnthropicMessageStop(msgspec.Struct, tag="message_stop", tag_field="type"):
    pass


class AnthropicError(msgspec.Struct):
    type: str
    message: str


class AnthropicErrorResponse(msgspec.Struct, tag="error", tag_field="type"):
    """Anthropic's error shape, as a body and as a stream's `error` event."""

    error: AnthropicError


class AnthropicContextManagement(msgspec.Struct):
    original_input_tokens: int


class AnthropicCountTokensResponse(msgspec.Struct):
    input_tokens: int
    context_management: AnthropicContextManagement
