"""The starlette application: routes, OpenAI-shaped errors, /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from functools import partial

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from daemon.http import openapi, prompt_render, tokenize
from daemon.http.anthropic import Messages
from daemon.http.conncap import ConnectionCap
from daemon.http.errors import ApiError
from daemon.http.openai_responses import ResponsesApi
from daemon.http.routermetrics import RouterCollector
from daemon.http.routes import Routes
from daemon.service import Service

log = logging.getLogger(__name__)


def build_app(service: Service) -> Starlette:
    routes = Routes(service)
    responses = ResponsesApi(routes)
    messages = Messages(routes)
    metrics = service.metrics
    metrics.registry.register(RouterCollector(service))

    def count_error(exc: ApiError) -> None:
        metrics.http_errors.labels(str(exc.status), exc.info.type).inc()

    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        count_error(exc)
        return exc.response()

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return await on_api_error(request, ApiError(exc.status_code, str(exc.detail), kind))

    async def on_crash(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s", request.url.path)
        return await on_api_error(request, ApiError(500, "internal server error", "server_error"))

    async def render_openapi(request: Request) -> Response:
        # Built per call: priority limits change on reload; it takes about a millisecond.
        doc = openapi.document(service.config.model.name, service.config.limits)
        return Response(msgspec.json.encode(doc), media_type="application/json")

    async def render_metrics(request: Request) -> Response:
        routes.authorize_monitoring(request)
        service.observe_ended()
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        probe = asyncio.create_task(metrics.watch_loop_lag(), name="loop-lag")
        try:
            yield
        finally:
            await responses.close()
            probe.cancel()
            await asyncio.gather(probe, return_exceptions=True)

    app = Starlette(
        lifespan=lifespan,
        routes=[
            Route("/v1/chat/completions", routes.chat_completions, methods=["POST"]),
            Route("/v1/completions", routes.completions, methods=["POST"]),
            Route("/v1/responses", responses.create, methods=["POST"]),
            Route("/v1/responses/{response_id}", responses.retrieve, methods=["GET"]),
            Route("/v1/responses/{response_id}/cancel", responses.cancel, methods=["POST"]),
            Route("/v1/messages", messages.create, methods=["POST"]),
            Route("/v1/messages/count_tokens", messages.count_tokens, methods=["POST"]),
            Route("/v1/chat/completions/render", partial(prompt_render.render_chat, routes),
                  methods=["POST"]),
            Route("/v1/completions/render", partial(prompt_render.render_completions, routes),
                  methods=["POST"]),
            Route("/v1/models", routes.models, methods=["GET"]),
            Route("/tokenize", partial(tokenize.tokenize, service, routes.bodies),
                  methods=["POST"]),
            Route("/detokenize", partial(tokenize.detokenize, service, routes.bodies),
                  methods=["POST"]),
            Route("/version", partial(tokenize.version, service), methods=["GET"]),
            Route("/health", routes.health, methods=["GET"]),
            # vLLM's and SageMaker's liveness path: /health's answer, GET or POST
            Route("/ping", routes.health, methods=["GET", "POST"]),
            Route("/metrics", render_metrics, methods=["GET"]),
            Route("/openapi.json", render_openapi, methods=["GET"]),
        ],
        exception_handlers={ApiError: on_api_error, HTTPException: on_http_error,
                            Exception: on_crash},
        middleware=[Middleware(ConnectionCap, limit=lambda: service.config.server.max_connections,
                               retry_after_s=service.retry_after_s, count_refusal=count_error,
                               gauge=metrics.requests_open)],
    )
    app.state.metrics = metrics
    app.state.responses = responses
    return app
