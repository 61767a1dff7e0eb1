"""Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`, with
vLLM's meaning (its Anthropic server converts each request into a chat request and serves
that). Here too: the request becomes the chat request it means (anthropic_convert.py) and
takes the chat route's one path to a job (Routes.admit_chat: checked, templated, predicted,
ordered, preempted and resumed by the policy, latency objectives honoured); the answer is
written in Anthropic's shapes (anthropic_render.py). Every error is a 4xx or 5xx in
Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`, its message starting
with the field it is about."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from daemon.http import anthropic_render, chat, limits, translate
from daemon.http.anthropic_convert import template_probe, to_chat
from daemon.http.anthropic_render import ChatJob
from daemon.http.anthropic_schemas import (
    AnthropicContextManagement,
    AnthropicCountTokensRequest,
    AnthropicCountTokensResponse,
    AnthropicError,
    AnthropicErrorResponse,
    AnthropicMessagesRequest,
    AnthropicPrompt,
)
from daemon.http.auth import authorize
from daemon.http.errors import ApiError
from daemon.http.routes import Routes
from daemon.http.schemas import ChatCompletionRequest
from daemon.service import Service
from daemon.tokenizer import TemplateError

_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
# Anthropic's error types by status (its SDK picks its exception by the status alone).
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
          500: "api_error", 503: "overloaded_error"}


class AnthropicApiError(ApiError):
    """An ApiError written in Anthropic's shape; the field it names leads the message."""

    def __init__(self, error: ApiError) -> None:
        info = error.info
        message = info.message if info.param is None or \
            info.message.startswith(f"{info.param}: ") else f"{info.param}: {info.message}"
        super().__init__(error.status, message, _TYPES.get(error.status, info.type),
                         info.param, info.code)
        self.headers = error.headers

    def body(self) -> bytes:
        info = self.info
        return msgspec.json.encode(AnthropicErrorResponse(AnthropicError(info.type,
                                                                         info.message)))


class Messages:
    """The Messages API's two endpoints on the chat route's path to a job."""

    def __init__(self, routes: Routes) -> None:
        self.routes = routes
        self.service = routes.service
        self._template: tuple[bool, str] | None = None  # template_probe's answer

    async def create(self, request: Request) -> Response:
        try:
            return await self._create(request)
        except ApiError as exc:
            raise AnthropicApiError(exc) from None

    async def count_tokens(self, request: Request) -> Response:
        try:
            return await self._count_tokens(request)
        except ApiError as exc:
            raise AnthropicApiError(exc) from None

    async def _create(self, request: Request) -> Response:
        svc = self.service
        key = authorize(svc.keys, request, "api")
        req: AnthropicMessagesRequest = await self.routes._read(request, AnthropicMessagesRequest)
        try:  # at the door, before any client-sized work (as chat's `stop`)
            limits.check_stop(req.stop_sequences, svc.request_limits)
        except ApiError as exc:
            raise translate.bad_request(str(exc), "stop_sequences") from None
        chat_req = await self._chat(req)
        answer, prepared = await self.routes.admit_chat(request, chat_req, key)
        job = ChatJob(answer, self.routes._options(chat_req, prepared.top, False),
                      prepared.chosen, prepared.readers)
        if req.stream:
            return StreamingResponse(anthropic_render.stream(job, svc.scheduler),
                                     media_type="text/event-stream",
                                     headers={**_SSE_HEADERS, **answer.headers})
        await self.routes._collect(request, answer)
        body = anthropic_render.whole(job)
        return Response(msgspec.json.encode(body), headers=answer.headers,
                        media_type="application/json")

    async def _count_tokens(self, request: Request) -> Response:
        """The prompt's tokens as /v1/messages would run it (vLLM renders the same chat
        request; nothing runs)."""
        authorize(self.service.keys, request, "api")
        req = await self.routes._read(request, AnthropicCountTokensRequest)
        chat_req = await self._chat(req)
        async with self.routes._preparing:  # as the chat route's preparation (GIL)
            count = await asyncio.to_thread(_count, self.service, chat_req)
        body = AnthropicCountTokensResponse(count, AnthropicContextManagement(count))
        return Response(msgspec.json.encode(body), media_type="application/json")

    async def _chat(self, req: AnthropicPrompt) -> ChatCompletionRequest:
        """The chat request `req` means, made off the event loop (it walks the request)."""
        self.routes._check_model(req.model)
        async with self.routes._preparing:  # as the chat route's preparation (GIL)
            return await asyncio.to_thread(self._convert, req)

    def _convert(self, req: AnthropicPrompt) -> ChatCompletionRequest:
        if self._template is None:  # once: the template does not change while serving
            self._template = template_probe(self._render)
        merge, disabled_effort = self._template
        return to_chat(req, merge_inline_system=merge, disabled_effort=disabled_effort)

    def _render(self, messages: list[dict[str, Any]], effort: str | None,
                generation: bool) -> str | None:
        """The template's text for `messages` at a reasoning effort; None if it refuses."""
        kwargs = {} if effort is None else {"reasoning_effort": effort,
                                            "enable_thinking": effort != "none"}
        try:
            return self.service.tokenizer.render_chat(messages, add_generation_prompt=generation,
                                                      template_kwargs=kwargs)
        except TemplateError:
            return None


def _count(svc: Service, req: ChatCompletionRequest) -> int:
    """The chat template's prompt tokens for `req`, with the chat route's checks."""
    chat.check(req, svc.config.model.tool_call_parser)
    template, _ = translate.chat_messages(req)
    try:
        ids = svc.tokenizer.encode_chat(template, add_special_tokens=False,
                                        **chat.template_options(req))
    except TemplateError as exc:
        raise translate.bad_request(str(exc), "messages") from None
    return len(ids)
