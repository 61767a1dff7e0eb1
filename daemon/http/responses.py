"""OpenAI response bodies (msgspec), shaped as vLLM's OpenAI server shapes them, and the
bodies of the endpoints clients probe (/tokenize, /detokenize, /version)."""

from __future__ import annotations

import msgspec


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


# ---- logprobs ----------------------------------------------------------------------------

class TopLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ContentLogprob(msgspec.Struct):
    """Chat: one output token, its logprob and the top candidates."""

    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = []


class ChatLogprobs(msgspec.Struct):
    content: list[ContentLogprob] | None = None


class CompletionLogprobs(msgspec.Struct):
    """Completions: parallel lists, one entry per token (echoed prompt tokens first)."""

    text_offset: list[int] = []
    token_logprobs: list[float | None] = []
    tokens: list[str] = []
    top_logprobs: list[dict[str, float] | None] = []


class PromptLogprob(msgspec.Struct):
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# A prompt token's candidates by token id (vLLM's prompt_logprobs shape); None for the first.
PromptLogprobs = list[dict[str, PromptLogprob] | None]


# ---- chat --------------------------------------------------------------------------------

class FunctionCallOut(msgspec.Struct):
    name: str
    arguments: str


class ToolCallOut(msgspec.Struct):
    id: str
    function: FunctionCallOut
    type: str = "function"


class ChatMessageOut(msgspec.Struct):
    role: str
    content: str | None
    # left out when no tool was called, as vLLM's ChatMessage does
    tool_calls: list[ToolCallOut] | msgspec.UnsetType = msgspec.UNSET
    reasoning: str | None = None


class ChatChoice(msgspec.Struct):
    index: int
    message: ChatMessageOut
    finish_reason: str | None
    logprobs: ChatLogprobs | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: str = "chat.completion"
    prompt_logprobs: PromptLogprobs | None = None
    prompt_token_ids: list[int] | None = None
    prompt_text: str | None = None


class ToolCallDelta(msgspec.Struct, omit_defaults=True):
    index: int
    id: str | None = None
    type: str | None = None
    function: dict[str, str] | None = None


class Delta(msgspec.Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(msgspec.Struct):
    index: int
    delta: Delta
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionChunk(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    object: str = "chat.completion.chunk"
    prompt_token_ids: list[int] | None = None


# ---- completions -------------------------------------------------------------------------

class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    finish_reason: str | None = None
    logprobs: CompletionLogprobs | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    prompt_logprobs: PromptLogprobs | None = None
    prompt_token_ids: list[int] | None = None


class Completion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    object: str = "text_completion"


# ---- models, errors, tokenizer, version --------------------------------------------------

class ModelCard(msgspec.Struct):
    id: str
    created: int
    owned_by: str = "lengthwise"
    object: str = "model"
    root: str | None = None
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


class TokenizeResult(msgspec.Struct):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResult(msgspec.Struct):
    prompt: str


class Version(msgspec.Struct):
    version: str
