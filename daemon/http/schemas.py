"""OpenAI request bodies (msgspec), with vLLM's fields: vLLM's OpenAI server (the pinned
version) is the contract, field for field (tests/http/test_schemas.py reads vLLM's request
models and fails on any field missing here).

A field nobody knows is refused (400 naming it), where vLLM would ignore it with a warning:
a typo must not silently change nothing. Fields vLLM's default server refuses, or that
lengthwise cannot serve with the same meaning, are in `REFUSED` with the reason, and are
refused unless their value asks for nothing. Ranges that a type can say are checked while
decoding; the rest are vLLM's own checks, run before a job exists (daemon/http/translate.py).
Response bodies are in responses.py. /openapi.json is generated from these classes.
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
TokenId = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
StopString = Annotated[str, msgspec.Meta(min_length=1)]  # vLLM refuses empty stop strings
StopList = list[StopString]
NumLogprobs = Annotated[int, msgspec.Meta(ge=-1, le=INT64_MAX)]  # -1: the whole vocabulary
Xarg = str | int | float | list[str | int | float]


class _Body(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class ContentPart(msgspec.Struct, kw_only=True):
    """Lenient: parts other than text are refused by type, with a clearer message."""

    type: str
    text: str | None = None


class FunctionCall(msgspec.Struct, kw_only=True):
    name: str
    arguments: str = ""


class ToolCall(msgspec.Struct, kw_only=True):
    id: str = ""
    type: str = "function"
    function: FunctionCall


class ChatMessage(_Body, kw_only=True):
    """One message; any role vLLM's templates take (system, user, assistant, tool, ...)."""

    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None  # vLLM's older name of `reasoning`
    # What clients echo back from an earlier answer; no meaning for the prompt.
    refusal: str | None = None
    function_call: Any = None
    audio: Any = None
    annotations: list[Any] | None = None


class StreamOptions(_Body, kw_only=True):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False  # usage in every chunk (vLLM)


class FunctionDefinition(msgspec.Struct, kw_only=True):
    name: Annotated[str, msgspec.Meta(min_length=1)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Body, kw_only=True):
    type: Literal["function"] = "function"
    function: FunctionDefinition
    defer_loading: bool | None = None


class NamedFunction(msgspec.Struct, kw_only=True):
    name: Annotated[str, msgspec.Meta(min_length=1)]


class NamedToolChoice(_Body, kw_only=True):
    function: NamedFunction
    type: Literal["function"] = "function"


class JsonSchemaFormat(msgspec.Struct, kw_only=True):
    name: str = "response"
    description: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class ResponseFormat(msgspec.Struct, kw_only=True):
    """text, json_object, json_schema (vLLM also: structural_tag, with `format` or the
    legacy `structures` + `triggers`)."""

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    format: Any = None
    structures: list[Any] | None = None
    triggers: list[str] | None = None


class StructuredOutputs(_Body, kw_only=True):
    """vLLM's StructuredOutputsParams: one of json, regex, choice, grammar, json_object,
    structural_tag."""

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None


class RepetitionDetection(_Body, kw_only=True):
    max_pattern_size: Annotated[int, msgspec.Meta(ge=0)] = 0
    min_pattern_size: Annotated[int, msgspec.Meta(ge=0)] = 0
    min_count: Annotated[int, msgspec.Meta(ge=0)] = 0


class SamplingFields(_Body, kw_only=True):
    """Fields shared by /v1/chat/completions and /v1/completions (vLLM's, same meaning)."""

    model: str | None = None  # None: the served model
    max_tokens: Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)] | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: Annotated[int, msgspec.Meta(ge=1, le=INT64_MAX)] | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: StopString | StopList | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    user: str | None = None
    # vLLM's sampling extensions
    top_k: Annotated[int, msgspec.Meta(ge=-1, le=INT64_MAX)] | None = None
    min_p: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, msgspec.Meta(gt=0.0)] | None = None
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)] = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: Annotated[int, msgspec.Meta(ge=-1, le=INT64_MAX)] | None = None
    truncation_side: Literal["left", "right"] | None = None
    allowed_token_ids: list[TokenId] | None = None
    prompt_logprobs: NumLogprobs | None = None
    logprob_token_ids: list[TokenId] | None = None
    bad_words: list[str] | None = None
    structured_outputs: StructuredOutputs | None = None
    add_special_tokens: bool | None = None  # None: the endpoint's default (vLLM's)
    echo: bool | None = False
    watermarking: bool | None = None
    repetition_detection: RepetitionDetection | None = None
    thinking_token_budget: Annotated[int, msgspec.Meta(ge=-1, le=INT64_MAX)] | None = None
    # Lower = more urgent (as vLLM); lengthwise orders by length within a class.
    priority: Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)] = 0
    request_id: str | None = None  # the response's id (vLLM: "cmpl-" / "chatcmpl-" + it)
    session_id: str | None = None
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None
    cache_salt: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Xarg] | None = None
    stream_interval: Annotated[int, msgspec.Meta(ge=1, le=INT64_MAX)] | None = None
    # Render-endpoint fields: vLLM ignores them on generation endpoints, as lengthwise does.
    routed_experts_prompt_start: Annotated[int, msgspec.Meta(ge=0)] = 0
    return_token_offsets: bool | None = False
    mm_payload: Literal["tensors", "none"] = "tensors"
    return_mm_kwargs: bool | None = None
    # Refused (REFUSED says why) unless they ask for nothing.
    use_beam_search: bool = False
    length_penalty: float = 1.0  # beam search only: ignored otherwise (as vLLM)
    ec_transfer_params: dict[str, Any] | None = None
    # OpenAI fields vLLM does not have: accepted where they change nothing.
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    best_of: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    web_search_options: Any = None
    functions: Any = None
    function_call: Any = None


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)] | None = None
    logprobs: bool | None = False
    top_logprobs: NumLogprobs | None = 0
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = True
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh",
                              "max"] | None = None
    include_reasoning: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_prompt_text: bool | None = None
    media_io_kwargs: dict[str, dict[str, Any]] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None


# vLLM's prompt: text, token ids, or a batch of texts or of token-id lists (msgspec takes
# one list type in a union: the kinds are told apart in translate.completion_prompts).
Prompt = str | list[str | TokenId | list[TokenId]]


class CompletionRequest(SamplingFields, kw_only=True):
    prompt: Prompt | None = None
    logprobs: NumLogprobs | None = None
    suffix: str | None = None
    prompt_embeds: bytes | list[bytes] | None = None


# Fields refused unless their value asks for nothing (null, false, empty, the default),
# with the reason: what vLLM's default server refuses too, or what a text-only model behind
# a scheduler cannot serve with vLLM's meaning.
REFUSED: dict[str, str] = {
    "use_beam_search": "beam search is not supported by lengthwise (the scheduler runs "
                       "one sequence per answer)",
    "chat_template": "a chat template in the request is refused, as vLLM refuses it "
                     "without --trust-request-chat-template",
    "prompt_embeds": "prompt embeddings are refused, as vLLM refuses them without "
                     "--enable-prompt-embeds",
    "suffix": "suffix needs a model with fill-in-the-middle rendering; this one has none",
    "ec_transfer_params": "encoder-cache transfer needs a multimodal model",
    "media_io_kwargs": "media inputs need a multimodal model",
    "mm_processor_kwargs": "media inputs need a multimodal model",
    "best_of": "best_of is not in vLLM's API (use n)",
    "audio": "audio output is not supported",
    "modalities": "output modalities other than text are not supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "functions": "the legacy functions API is not supported (use tools)",
    "function_call": "the legacy functions API is not supported (use tool_choice)",
}


# ---- /tokenize, /detokenize (vLLM's; a chat body or a completion body) -------------------

class TokenizeRequest(_Body, kw_only=True):
    """vLLM's TokenizeCompletionRequest or TokenizeChatRequest, told apart by `messages`."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # None: True for a prompt, False for messages
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool | None = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    media_io_kwargs: dict[str, dict[str, Any]] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(_Body, kw_only=True):
    model: str | None = None
    tokens: list[TokenId]
