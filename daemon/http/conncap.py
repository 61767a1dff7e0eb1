"""A cap on open connections: ASGI middleware in front of the routes.

The HTTP server (uvicorn or hypercorn) accepts every connection the listen backlog hands it.
Each HTTP/1.1 connection carries one request at a time and an idle keep-alive connection is
closed after the server's keep-alive timeout (5 s on both), so what holds memory and file
descriptors are connections with a request in flight: SSE streams, bodies being read, waits
for a slot. Beyond `server.max_connections` of those a new request gets 503 with Retry-After
and `Connection: close` at once, before its body is read. On HTTP/2 (hypercorn's h2c) each
request in flight is one stream of a shared connection and counts as one; the h2 library
drops the Connection header there (HTTP/2 has none) and the connection stays open.
/health and /metrics are not counted nor refused: probes must see the daemon's state under
load, not the cap. The count is exported as lengthwise_http_requests_open.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import Gauge
from starlette.types import ASGIApp, Receive, Scope, Send

from daemon.http.errors import ApiError

_EXEMPT = frozenset({"/health", "/metrics"})


class ConnectionCap:
    def __init__(self, app: ASGIApp, limit: Callable[[], int], retry_after_s: Callable[[], int],
                 count_refusal: Callable[[ApiError], None], gauge: Gauge) -> None:
        self.app = app
        self.limit = limit  # read per request: the config object may be replaced
        self.retry_after_s = retry_after_s
        self.count_refusal = count_refusal
        self.open = 0  # connections with a request in flight, exempt paths aside
        self.gauge = gauge

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in _EXEMPT:
            await self.app(scope, receive, send)
            return
        if self.open >= self.limit():
            refusal = ApiError(503, f"too many open connections (limit {self.limit()}); "
                               "retry later", "server_error", code="too_many_connections",
                               retry_after_s=self.retry_after_s())
            self.count_refusal(refusal)
            response = refusal.response()
            response.headers["connection"] = "close"
            await response(scope, receive, send)
            return
        self.open += 1
        self.gauge.set(self.open)
        try:
            await self.app(scope, receive, send)
        finally:
            self.open -= 1
            self.gauge.set(self.open)
