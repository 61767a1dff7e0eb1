"""OpenAI request and response bodies (msgspec).

A request field lengthwise does not know is refused (400 naming it), not silently ignored.
Fields of the OpenAI API it does not implement are declared in `UNSUPPORTED` and refused
unless their value changes nothing (null, false, empty); a few that never change the answer
are accepted and ignored (`user`, `metadata`, `store`, `service_tier`,
`parallel_tool_calls`). /openapi.json is generated from these classes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# Ranges as OpenAI documents them (and vLLM enforces); checked while decoding.
Seed = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
Temperature = Annotated[float, msgspec.Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]
Penalty = Annotated[float, msgspec.Meta(ge=-2.0, le=2.0)]
TokenCount = Annotated[int, msgspec.Meta(ge=1)]
StopString = Annotated[str, msgspec.Meta(min_length=1)]  # vLLM refuses empty stop strings
StopList = Annotated[list[StopString], msgspec.Meta(max_length=4)]  # as OpenAI
Role = Literal["system", "user", "assistant", "developer", "tool"]


class _Body(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class ContentPart(msgspec.Struct, kw_only=True):
    """Lenient: parts other than text are refused by type, with a clearer message."""

    type: str
    text: str | None = None


class ChatMessage(_Body, kw_only=True):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    # What clients echo back from an earlier answer; tool calls are not supported.
    refusal: str | None = None
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None
    function_call: Any = None
    audio: Any = None
    annotations: list[Any] | None = None




class StreamOptions(_Body, kw_only=True):
    include_usage: bool = False


class SamplingFields(_Body, kw_only=True):
    """Fields shared by /v1/chat/completions and /v1/completions."""

    model: str
    max_tokens: TokenCount | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: StopString | StopList | None = None
    seed: Seed | None = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    # Accepted and ignored: they never change the answer.
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    parallel_tool_calls: bool | None = None
    # Not implemented (UNSUPPORTED): any type, so that the 400 says "not supported".
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    response_format: Any = None
    logprobs: Any = None
    top_logprobs: Any = None
    logit_bias: Any = None
    best_of: Any = None
    echo: Any = None
    suffix: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    web_search_options: Any = None
    reasoning_effort: Any = None
    top_k: Any = None
    min_p: Any = None
    repetition_penalty: Any = None
    # vLLM extensions, used by benchmarks to force output lengths.
    ignore_eos: bool = False
    min_tokens: Annotated[int, msgspec.Meta(ge=0)] = 0
    # Lower = more urgent (as vLLM); lengthwise orders by length within a class.
    priority: int = 0


# Fields of the OpenAI API (and vLLM's) that lengthwise does not implement, typed Any: a 400
# unless the value is null, false or empty (or means "off": best_of 1, a text format).
UNSUPPORTED = tuple(f.name for f in msgspec.structs.fields(SamplingFields) if f.type is Any)


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: TokenCount | None = None


class CompletionRequest(SamplingFields, kw_only=True):
    prompt: str | list[Any]


# ---- responses ---------------------------------------------------------------------------

class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatMessageOut(msgspec.Struct):
    role: str
    content: str


class ChatChoice(msgspec.Struct):
    index: int
    message: ChatMessageOut
    finish_reason: str | None
    logprobs: None = None


class ChatCompletion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: str = "chat.completion"


class Delta(msgspec.Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None


class ChatChunkChoice(msgspec.Struct):
    index: int
    delta: Delta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    object: str = "chat.completion.chunk"


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    finish_reason: str | None = None
    logprobs: None = None


class Completion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    object: str = "text_completion"


class ModelCard(msgspec.Struct):
    id: str
    created: int
    owned_by: str = "lengthwise"
    object: str = "model"
    max_model_len: int | None = None


class ModelList(msgspec.Struct):
    data: list[ModelCard]
    object: str = "list"


class ErrorInfo(msgspec.Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(msgspec.Struct):
    error: ErrorInfo
