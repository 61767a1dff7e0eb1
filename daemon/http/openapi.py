"""/openapi.json: an OpenAPI 3.1 document generated from the msgspec request and response
schemas, so the document and the validation cannot drift apart."""

from __future__ import annotations

from typing import Any

import msgspec

from daemon.config import LimitsConfig
from daemon.http.anthropic_schemas import (
    AnthropicCountTokensRequest,
    AnthropicCountTokensResponse,
    AnthropicErrorResponse,
    AnthropicMessagesRequest,
    AnthropicMessagesResponse,
)
from daemon.http.prompt_render import Rendered
from daemon.http.responses import (
    ChatCompletion,
    Completion,
    DetokenizeResult,
    ErrorBody,
    ModelList,
    TokenizeResult,
    Version,
)
from daemon.http.responses_objects import ResponseObject
from daemon.http.responses_schemas import ResponsesRequest
from daemon.http.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)

_REF = "#/components/schemas/{name}"
_ERRORS = {
    "400": "Bad input: the error's `param` names the field",
    "401": "Missing or incorrect API key (when the server has keys)",
    "403": "The key may not use this endpoint or this priority",
    "413": "Body larger than server.max_body_bytes",
    "429": "Queue full (see Retry-After)",
    "503": "Starting, draining or no engine (see Retry-After)",
}


# One server-sent event as the HTML standard defines it: `data` is the JSON chunk, `event` the
# event's type where the API names one (responses, messages).
_SSE_EVENT = {"type": "object", "required": ["data"], "properties": {
    "data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"},
    "retry": {"type": "integer"}}}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(name=name)}


def _responses(ok: dict[str, Any], stream: bool, error: str) -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": ok}}
    if stream:  # "stream": true answers with server-sent events
        # The schema of one event (OpenAPI 3.1 has no itemSchema; tools read `schema` so).
        content["text/event-stream"] = {"schema": _SSE_EVENT}
    out: dict[str, Any] = {"200": {"description": "OK", "content": content}}
    for code, text in _ERRORS.items():
        out[code] = {"description": text,
                     "content": {"application/json": {"schema": _ref(error)}}}
    return out


def _post(request: str, ok: str, stream: bool = True, error: str = "ErrorBody",
          many: bool = False) -> dict[str, Any]:
    """A POST of `request` answered with `ok` (a list of them: `many`), errors in `error`'s
    shape."""
    answer = {"type": "array", "items": _ref(ok)} if many else _ref(ok)
    return {"post": {"requestBody": {"required": True, "content": {
        "application/json": {"schema": _ref(request)}}},
        "responses": _responses(answer, stream, error)}}


def _post_json(request: str, ok: str) -> dict[str, Any]:
    return _post(request, ok, stream=False)


def _get(ok: str | None, methods: tuple[str, ...] = ("get",)) -> dict[str, Any]:
    content = {"application/json": {"schema": _ref(ok) if ok else {"type": "object"}}}
    answer = {"responses": {"200": {"description": "OK", "content": content},
                            "503": {"description": "Not serving", "content": content}}}
    return dict.fromkeys(methods, answer)


def _stored(method: str) -> dict[str, Any]:
    """GET /v1/responses/{id} and its cancel: the stored response, or 404 / 400."""
    ok: dict[str, Any] = {"application/json": {"schema": _ref("ResponseObject")}}
    if method == "get":  # ?stream=true replays a background stream's events
        ok["text/event-stream"] = {"schema": _SSE_EVENT}
    error = {"application/json": {"schema": _ref("ErrorBody")}}
    params = [{"name": "response_id", "in": "path", "required": True,
               "schema": {"type": "string"}}]
    if method == "get":
        params += [{"name": "stream", "in": "query", "schema": {"type": "boolean"}},
                   {"name": "starting_after", "in": "query", "schema": {"type": "integer"}}]
    return {method: {"parameters": params, "responses": {
        "200": {"description": "OK", "content": ok},
        "400": {"description": "Bad input (cancel: the response is not running)",
                "content": error},
        "401": {"description": _ERRORS["401"], "content": error},
        "404": {"description": "No such response (never stored, or evicted)",
                "content": error}}}}


def document(model_name: str, limits: LimitsConfig) -> dict[str, Any]:
    """The whole document; `model` and `priority` as this server's config allows them."""
    _, components = msgspec.json.schema_components(
        [ChatCompletionRequest, CompletionRequest, ChatCompletion, Completion, ModelList,
         ErrorBody, TokenizeRequest, TokenizeResult, DetokenizeRequest, DetokenizeResult,
         Version, ResponsesRequest, ResponseObject, AnthropicMessagesRequest,
         AnthropicMessagesResponse, AnthropicCountTokensRequest, AnthropicCountTokensResponse,
         AnthropicErrorResponse, Rendered], ref_template=_REF)
    for name in ("ChatCompletionRequest", "CompletionRequest", "ResponsesRequest",
                 "AnthropicMessagesRequest"):
        fields = components[name]["properties"]
        served = {"type": "string", "enum": [model_name]}
        # vLLM's OpenAI models are optional (null or left out: the served model); Anthropic's
        # is required, as in vLLM's AnthropicMessagesRequest.
        fields["model"] = served if name.startswith("Anthropic") else {
            "anyOf": [served, {"type": "null"}], "default": None}
        fields["priority"] = {"type": "integer", "default": 0, "minimum": limits.priority_min,
                              "maximum": limits.priority_max}
    components["AnthropicCountTokensRequest"]["properties"]["model"] = {
        "type": "string", "enum": [model_name]}
    for schema in components.values():  # unknown request fields are refused
        if schema.get("type") == "object" and schema["title"].endswith((
                "Request", "Message", "Options", "Tool", "ToolChoice", "Outputs",
                "Detection")):
            schema["additionalProperties"] = False
    responses = _post("ResponsesRequest", "ResponseObject")
    responses["post"]["responses"]["404"] = {
        "description": "previous_response_id names no stored response",
        "content": {"application/json": {"schema": _ref("ErrorBody")}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "lengthwise", "version": "0.1.0",
                 "description": "OpenAI-compatible chat, completions and responses, "
                                "Anthropic's messages, length-aware scheduling"},
        "paths": {
            "/v1/chat/completions": _post("ChatCompletionRequest", "ChatCompletion"),
            "/v1/completions": _post("CompletionRequest", "Completion"),
            "/v1/responses": responses,
            "/v1/responses/{response_id}": _stored("get"),
            "/v1/responses/{response_id}/cancel": _stored("post"),
            "/v1/messages": _post("AnthropicMessagesRequest", "AnthropicMessagesResponse",
                                  error="AnthropicErrorResponse"),
            "/v1/messages/count_tokens": _post(
                "AnthropicCountTokensRequest", "AnthropicCountTokensResponse", stream=False,
                error="AnthropicErrorResponse"),
            "/v1/chat/completions/render": _post_json("ChatCompletionRequest", "Rendered"),
            "/v1/completions/render": _post("CompletionRequest", "Rendered", stream=False,
                                            many=True),
            "/v1/models": _get("ModelList"),
            "/tokenize": _post_json("TokenizeRequest", "TokenizeResult"),
            "/detokenize": _post_json("DetokenizeRequest", "DetokenizeResult"),
            "/version": _get("Version"),
            "/health": _get(None),
            "/ping": _get(None, ("get", "post")),  # /health's answer
        },
        "components": {"schemas": components},
    }
