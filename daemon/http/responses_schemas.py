"""OpenAI's Responses API (/v1/responses) as vLLM's server serves it: the request body with
vLLM's fields (tests/http/test_schemas.py reads vLLM's ResponsesRequest and fails on any
field missing here). The response object and the stream events: responses_objects.py.

The top-level request refuses unknown fields, as the chat request does. Input items, tools
and the other nested objects are OpenAI's own types, which clients echo back from earlier
responses with fields that grow over time: they are read leniently (unknown fields are
ignored) and checked by hand where the field matters (daemon/http/responses_input.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from daemon.http.schemas import (
    INT64_MAX,
    INT64_MIN,
    Penalty,
    Seed,
    StopList,
    StopString,
    StructuredOutputs,
    Temperature,
    TokenId,
    TopP,
    Xarg,
)

# ---- request -----------------------------------------------------------------------------


class ContentPart(msgspec.Struct, kw_only=True):
    """input_text / output_text / reasoning_text / refusal; images and files are refused by
    type."""

    type: str
    text: str | None = None
    refusal: str | None = None


class InputItem(msgspec.Struct, kw_only=True):
    """One input item: a message (`type` "message" or left out), a function_call, a
    function_call_output or a reasoning item (the fields each reads)."""

    type: str | None = None
    role: str | None = None
    content: str | list[ContentPart] | None = None
    status: str | None = None
    id: str | None = None
    # function_call / function_call_output
    call_id: str | None = None
    name: str | None = None
    namespace: str | None = None
    arguments: str | None = None
    output: str | list[ContentPart] | None = None
    # reasoning
    summary: list[ContentPart] | None = None
    encrypted_content: str | None = None


class FunctionToolParam(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A tool (only `function` tools are served: the others need vLLM's tool server)."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    defer_loading: bool | None = None


class ToolChoiceObject(msgspec.Struct, kw_only=True, omit_defaults=True):
    """{"type": "function", "name": ...} (the others name hosted tools or tool sets)."""

    type: str
    name: str | None = None


ToolChoice = Literal["none", "auto", "required"] | ToolChoiceObject


class TextFormat(msgspec.Struct, kw_only=True, omit_defaults=True):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class TextConfig(msgspec.Struct, kw_only=True, omit_defaults=True):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class Reasoning(msgspec.Struct, kw_only=True, omit_defaults=True):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    summary: str | None = None
    generate_summary: str | None = None


Include = Literal["code_interpreter_call.outputs", "computer_call_output.output.image_url",
                  "file_search_call.results", "message.input_image.image_url",
                  "message.output_text.logprobs", "reasoning.encrypted_content"]
ServiceTier = Literal["auto", "default", "flex", "scale", "priority"]


class ResponsesRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's ResponsesRequest, field for field, with its defaults."""

    input: str | list[InputItem]
    model: str | None = None
    background: bool | None = False
    include: list[Include] | None = None
    instructions: str | None = None
    max_output_tokens: Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)] | None = None
    max_tool_calls: int | None = None
    metadata: dict[str, str] | None = None
    logit_bias: dict[str, float] | None = None
    parallel_tool_calls: bool | None = True
    previous_response_id: str | None = None
    prompt: Any = None  # refused, as vLLM refuses prompt templates
    reasoning: Reasoning | None = None
    include_reasoning: bool = True
    service_tier: ServiceTier = "auto"
    store: bool | None = True
    stream: bool | None = False
    temperature: Temperature | None = None
    text: TextConfig | None = None
    tool_choice: ToolChoice = "auto"
    tools: list[FunctionToolParam] = []
    top_logprobs: Annotated[int, msgspec.Meta(ge=-1, le=INT64_MAX)] | None = 0
    top_p: TopP | None = None
    top_k: Annotated[int, msgspec.Meta(ge=-1, le=INT64_MAX)] | None = None
    min_p: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    truncation: Literal["auto", "disabled"] | None = "disabled"
    user: str | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    prompt_cache_key: str | None = None  # vLLM ignores it too
    watermarking: bool | None = None
    request_id: str | None = None  # the response's id (vLLM: resp_<random> when left out)
    session_id: str | None = None
    media_io_kwargs: dict[str, dict[str, Any]] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    priority: Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)] = 0
    mm_payload: Literal["tensors", "none"] = "tensors"  # render endpoints only (ignored)
    return_mm_kwargs: bool | None = None
    cache_salt: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)] | None = None
    enable_response_messages: bool = False
    previous_input_messages: list[Any] | None = None
    structured_outputs: StructuredOutputs | None = None
    repetition_penalty: Annotated[float, msgspec.Meta(gt=0.0)] | None = None
    seed: Seed | None = None
    stop: StopString | StopList | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool = False
    vllm_xargs: dict[str, Xarg] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # OpenAI fields vLLM does not have: accepted where they change nothing.
    stream_options: dict[str, Any] | None = None
    conversation: Any = None
    safety_identifier: str | None = None
    prompt_cache_retention: str | None = None
    context_management: Any = None


# Fields refused unless they ask for nothing, with the reason.
REFUSED: dict[str, str] = {
    "prompt": "prompt template is not supported",  # vLLM's words
    "previous_input_messages": "previous_input_messages are read for harmony (gpt-oss) "
                               "models only",
    "media_io_kwargs": "media inputs need a multimodal model",
    "mm_processor_kwargs": "media inputs need a multimodal model",
    "ec_transfer_params": "encoder-cache transfer needs a multimodal model",
    "conversation": "conversations are not stored (use previous_response_id)",
    "context_management": "context management is not supported",
}
