"""The HTTP server the app runs on, chosen by `[server] http`: one function per server behind
one interface (`serve`), so the rest of the daemon never asks which one runs.

- "uvicorn" (the default) with httptools, as vLLM's own server: its send path is several
  Python layers shorter than hypercorn's, and one SSE chunk per token per stream makes that
  the front's largest cost per token (bench.frontcpu, 2026-11-26: the front's CPU per
  streamed token was 1.01x vLLM's server's on hypercorn, 0.75x on uvicorn).
  HTTP/1.1 only: an HTTP/2 preface gets a 400 and the connection closed; an `Upgrade: h2c`
  is ignored (an HTTP/1.1 answer).
- "hypercorn", the design card's server: HTTP/1.1 and cleartext HTTP/2 (h2c), both with
  prior knowledge and by `Upgrade: h2c` (a request without a body).

Both get the socket the daemon bound (`listen`: a bind error raises there, before anything
starts; uvicorn would exit the process), the same backlog, no access log, no signal handling
of their own (the daemon's drains first), and stop when `stop` is set: they close the
listening socket, then give open connections `graceful_timeout_s` before cancelling them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
from collections.abc import Awaitable, Callable, Iterator
from http import HTTPStatus
from typing import Any, cast

import h11
import uvicorn
from hypercorn import protocol as hypercorn_protocol
from hypercorn.asyncio.run import worker_serve
from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.protocol.http_stream import HTTPStream
from hypercorn.protocol.ws_stream import WSStream
from hypercorn.typing import H11SendableEvent
from hypercorn.utils import wrap_app
from starlette.types import ASGIApp

from daemon.config import ServerConfig
from daemon.http.wire import OpenAIErrorsHttpTools

__all__ = ["listen", "serve"]


def listen(server: ServerConfig) -> socket.socket:
    """The listening socket on server.host:port with its backlog (OSError if it is taken)."""
    return socket.create_server(
        (server.host, server.port), backlog=server.backlog,
        family=socket.AF_INET6 if ":" in server.host else socket.AF_INET)


async def serve(app: ASGIApp, sock: socket.socket, server: ServerConfig,
                stop: asyncio.Event) -> None:
    """Serve `app` on `sock` with the configured HTTP server until `stop` is set."""
    await _SERVERS[server.http](app, sock, server, stop)


async def _uvicorn(app: ASGIApp, sock: socket.socket, server: ServerConfig,
                   stop: asyncio.Event) -> None:
    http = _UvicornServer(uvicorn.Config(
        app, http=OpenAIErrorsHttpTools, ws="none", loop="none", backlog=server.backlog,
        proxy_headers=False, log_config=None, access_log=False,
        timeout_graceful_shutdown=math.ceil(server.graceful_timeout_s)))
    stopped = asyncio.ensure_future(stop.wait())
    stopped.add_done_callback(lambda _: setattr(http, "should_exit", True))
    try:
        await http.serve(sockets=[sock])
    finally:
        stopped.cancel()


class _UvicornServer(uvicorn.Server):
    """uvicorn without its own signal handling: the daemon's (drain first) is the one."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _hypercorn(app: ASGIApp, sock: socket.socket, server: ServerConfig,
                     stop: asyncio.Event) -> None:
    config = HypercornConfig()
    config.backlog = server.backlog
    config.graceful_timeout = server.graceful_timeout_s
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    # Its protocol wrapper looks these up by name for each connection.
    hypercorn_protocol.H11Protocol = _H11WithReasons  # type: ignore[misc]
    hypercorn_protocol.H2Protocol = _H2KeepingClosedStreams  # type: ignore[misc]
    # worker_serve, not hypercorn.asyncio.serve: only it takes sockets already bound.
    await worker_serve(wrap_app(app, config.wsgi_max_body_size, "asgi"),  # type: ignore[arg-type]
                       config, sockets=Sockets([], [sock], []), shutdown_trigger=stop.wait)


# hypercorn 0.18's defects that the daemon meets, mended in subclasses of its protocols.

class _H11WithReasons(H11Protocol):
    """HTTP/1.1 with the status's reason phrase: hypercorn 0.18 sends none ("HTTP/1.1 429 "),
    and vLLM's bench client (aiohttp) then records a 429 as an error without a reason, which
    bench compare did not count as a refusal."""

    async def _send_h11_event(self, event: H11SendableEvent) -> None:
        if isinstance(event, (h11.Response, h11.InformationalResponse)) and not event.reason:
            kind = type(event)
            event = kind(status_code=event.status_code, headers=event.headers,
                         reason=_reason(event.status_code))
        await super()._send_h11_event(event)


class _H2KeepingClosedStreams(H2Protocol):
    """HTTP/2 whose connection survives a request body that arrives after its stream was
    answered (hypercorn issue 329, unreleased fix): a 503 from the connection cap, or a
    413, is sent before the body is read, and hypercorn 0.18 looks the body's stream up
    without a guard; the KeyError ended the connection with every stream on it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.streams = _Streams()


class _Streams(dict[int, HTTPStream | WSStream]):
    """A closed stream's late events go to a sink instead of raising KeyError (`in` and
    `pop` still see only the open streams)."""

    def __missing__(self, stream_id: int) -> HTTPStream | WSStream:
        return cast(HTTPStream, _CLOSED)


class _Closed:
    async def handle(self, event: object) -> None:
        pass


_CLOSED = _Closed()


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


_Serve = Callable[[ASGIApp, socket.socket, ServerConfig, asyncio.Event], Awaitable[None]]
_SERVERS: dict[str, _Serve] = {"uvicorn": _uvicorn, "hypercorn": _hypercorn}
