"""OpenAI request and response bodies (msgspec). Unknown request fields are ignored, as the
OpenAI API does for fields a server does not implement."""

from __future__ import annotations

from typing import Any

import msgspec


class _Body(msgspec.Struct, kw_only=True):
    pass


class ContentPart(_Body, kw_only=True):
    type: str
    text: str | None = None


class ChatMessage(_Body, kw_only=True):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None


class StreamOptions(_Body, kw_only=True):
    include_usage: bool = False


class SamplingFields(_Body, kw_only=True):
    """Fields shared by /v1/chat/completions and /v1/completions."""

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    user: str | None = None
    # vLLM extensions, used by benchmarks to force output lengths.
    ignore_eos: bool = False
    min_tokens: int = 0
    # Lower = more urgent (as vLLM); lengthwise orders by length within a class.
    priority: int = 0


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None


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
