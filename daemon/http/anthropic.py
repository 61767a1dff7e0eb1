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

from daemon.http import anthropic_render, chat
from daemon.http.anthropic_convert import template_probe, to_chat
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
        key = authorize(self.service.keys, request, "api")
        req: AnthropicMessagesRequest = await self.routes.read(request, AnthropicMessagesRequest)
        job = await self.routes.admit_chat(request, await self._chat(req), key)
        if req.stream:
            return StreamingResponse(anthropic_render.stream(job, self.service.scheduler),
                                     media_type="text/event-stream",
                                     headers={**_SSE_HEADERS, **job.answer.headers})
        await self.routes.collect(request, job.answer)
        body = anthropic_render.whole(job)
        return Response(msgspec.json.encode(body), headers=job.answer.headers,
                        media_type="application/json")

    async def _count_tokens(self, request: Request) -> Response:
        """The prompt's tokens as /v1/messages would run it (vLLM renders the same chat
        request; nothing runs)."""
        authorize(self.service.keys, request, "api")
        req = await self.routes.read(request, AnthropicCountTokensRequest)
        chat_req = await self._chat(req)
        chosen = chat.check(chat_req, self.service.config.model.tool_call_parser)
        prompt = await self.routes.chat_prompt(chat_req, chosen)
        count = len(prompt.ids)
        body = AnthropicCountTokensResponse(count, AnthropicContextManagement(count))
        return Response(msgspec.json.encode(body), media_type="application/json")

    async def _chat(self, req: AnthropicPrompt) -> ChatCompletionRequest:
        self.routes.check_model(req.model)
        if self._template is None:  # once: the template does not change while serving
            self._template = await asyncio.to_thread(template_probe, self._render)
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
