"""The Responses API's response bodies as vLLM's server writes them: the response object
(vLLM's ResponsesResponse), its output items (messages, function calls), usage, and the
typed stream events (`event: <type>`, sequence numbers from 0)."""

from __future__ import annotations

from typing import Any

import msgspec

from daemon.http.responses_schemas import (
    FunctionToolParam,
    Reasoning,
    TextConfig,
    ToolChoice,
)

# ---- response ----------------------------------------------------------------------------


class TopLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]


class Logprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class OutputText(msgspec.Struct):
    text: str
    annotations: list[Any] = []
    logprobs: list[Logprob] | None = None
    type: str = "output_text"


class OutputMessage(msgspec.Struct, tag="message", tag_field="type"):
    id: str
    content: list[OutputText]
    role: str = "assistant"
    status: str = "completed"


class FunctionCallItem(msgspec.Struct, tag="function_call", tag_field="type"):
    id: str
    call_id: str
    name: str
    arguments: str
    status: str = "completed"
    namespace: str | None = None


OutputItem = OutputMessage | FunctionCallItem


class InputTokensDetails(msgspec.Struct):
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    input_tokens_per_turn: list[int] = []
    cached_tokens_per_turn: list[int] = []


class OutputTokensDetails(msgspec.Struct):
    reasoning_tokens: int = 0
    tool_output_tokens: int = 0
    output_tokens_per_turn: list[int] = []
    tool_output_tokens_per_turn: list[int] = []


class ResponseUsage(msgspec.Struct):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(msgspec.Struct):
    reason: str


class RawMessage(msgspec.Struct):
    """enable_response_messages: what the model read or wrote, as text and token ids."""

    message: str
    tokens: list[int]
    type: str = "raw_message_tokens"


class ResponseObject(msgspec.Struct, kw_only=True):
    """vLLM's ResponsesResponse (the fields it writes, in its order)."""

    id: str
    created_at: int
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    metadata: dict[str, str] | None = None
    model: str
    object: str = "response"
    output: list[OutputItem]
    parallel_tool_calls: bool
    temperature: float
    tool_choice: ToolChoice
    tools: list[FunctionToolParam]
    top_p: float
    background: bool
    max_output_tokens: int
    max_tool_calls: int | None = None
    previous_response_id: str | None = None
    prompt: Any = None
    reasoning: Reasoning | None = None
    service_tier: str
    status: str  # queued | in_progress | completed | incomplete | cancelled | failed
    text: TextConfig | None = None
    top_logprobs: int | None = None
    truncation: str
    usage: ResponseUsage | None = None
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    input_messages: list[RawMessage] | None = None
    output_messages: list[RawMessage] | None = None


# ---- stream events (server-sent, `event: <type>`; sequence numbers from 0) ---------------


class ResponseEvent(msgspec.Struct, tag_field="type"):
    """response.created / response.in_progress / response.completed."""

    response: ResponseObject
    sequence_number: int


class Created(ResponseEvent, tag="response.created"):
    pass


class InProgress(ResponseEvent, tag="response.in_progress"):
    pass


class Completed(ResponseEvent, tag="response.completed"):
    pass


class ItemAdded(msgspec.Struct, tag="response.output_item.added", tag_field="type"):
    item: OutputItem
    output_index: int
    sequence_number: int


class ItemDone(msgspec.Struct, tag="response.output_item.done", tag_field="type"):
    item: OutputItem
    output_index: int
    sequence_number: int


class PartAdded(msgspec.Struct, tag="response.content_part.added", tag_field="type"):
    content_index: int
    item_id: str
    output_index: int
    part: OutputText
    sequence_number: int


class PartDone(msgspec.Struct, tag="response.content_part.done", tag_field="type"):
    content_index: int
    item_id: str
    output_index: int
    part: OutputText
    sequence_number: int


class StreamLogprob(msgspec.Struct):
    token: str
    logprob: float
    top_logprobs: list[dict[str, Any]]


class TextDelta(msgspec.Struct, tag="response.output_text.delta", tag_field="type"):
    content_index: int
    delta: str
    item_id: str
    logprobs: list[StreamLogprob]
    output_index: int
    sequence_number: int


class TextDone(msgspec.Struct, tag="response.output_text.done", tag_field="type"):
    content_index: int
    item_id: str
    logprobs: list[StreamLogprob]
    output_index: int
    sequence_number: int
    text: str


class ArgumentsDelta(msgspec.Struct, tag="response.function_call_arguments.delta",
                     tag_field="type"):
    delta: str
    item_id: str
    output_index: int
    sequence_number: int


class ArgumentsDone(msgspec.Struct, tag="response.function_call_arguments.done",
                    tag_field="type"):
    arguments: str
    item_id: str
    name: str
    output_index: int
    sequence_number: int


class ErrorEvent(msgspec.Struct, tag="error", tag_field="type"):
    """A job that failed mid-stream (vLLM sends its error body as the event)."""

    message: str
    code: str | None
    param: str | None
    sequence_number: int


Event = (Created | InProgress | Completed | ItemAdded | ItemDone | PartAdded | PartDone
         | TextDelta | TextDone | ArgumentsDelta | ArgumentsDone | ErrorEvent)
