"""Both HTTP servers (`[server] http`: uvicorn, hypercorn) on a real daemon over TCP, one
daemon per server shared by this module (simulated engine: the server is what is under
test): streams arrive token by token and whole, the listen backlog is the configured one,
a 429's status line carries its reason phrase (vLLM's bench client reads it), connections
beyond server.max_connections get 503 with Retry-After and are closed while /health still
answers, HTTP/2: hypercorn speaks h2c (prior knowledge and Upgrade), uvicorn refuses it at
once; and, last, SIGTERM: the drain, its limit and server.graceful_timeout_s, then exit 0."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import httpx
import pytest

from tests.support import DaemonProcess, config_text, free_port, listen_backlog, sim_profile

MODEL = "smollm2-135m-instruct"
LONG = {"model": MODEL, "stream": True, "max_tokens": 2000, "ignore_eos": True,
        "messages": [{"role": "user", "content": "Count to a thousand."}]}
SHORT = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
CAP = 3
MAX_WAITING = CAP  # the CAP held streams may all be queued at once
BACKLOG = 321  # not a default of either server
STEP_S = 0.05
DRAIN_S = 3.0
GRACE_S = 2.0


class Served:
    """A daemon on one HTTP server, shared by this module's tests; a test that stops it (the
    drain, last) leaves any test after it a new one."""

    def __init__(self, http: str, folder: Path, model: Path) -> None:
        self.http = http
        self._folder = folder
        self._model = model
        self._current: DaemonProcess | None = None
        self.exit_codes: list[int] = []

    @property
    def daemon(self) -> DaemonProcess:
        if self._current is None or self._current.proc.poll() is not None:
            self.close()
            self._current = self._start(len(self.exit_codes))
        return self._current

    @property
    def url(self) -> str:
        return self.daemon.base_url

    def _start(self, k: int) -> DaemonProcess:
        # A slow simulated step (50 ms): the held streams would run 100 s, far longer than
        # the test (they are cut when released). At 10 ms (20 s) the first held stream could
        # end on a loaded machine before the last was admitted, and free its connection.
        text = config_text(self._model, free_port(), engine_kind="sim", max_running=CAP + 1,
                           max_waiting=MAX_WAITING, drain_timeout_s=DRAIN_S, http=self.http,
                           extra=sim_profile(self._folder / "slow.json", decode_base_s=STEP_S)
                           + '[predictor]\npath = "none"\n')  # no encoder to load
        config = self._folder / f"lengthwise-{k}.toml"
        config.write_text(text.replace("[server]\n", f"[server]\nmax_connections = {CAP}\n"
                                       f"backlog = {BACKLOG}\ngraceful_timeout_s = {GRACE_S}\n"))
        daemon = DaemonProcess(config, self._folder / f"daemon-{k}.log")
        try:
            daemon.wait_ready()
            daemon.wait_log(f"({self.http}, policy")
        except BaseException:
            daemon.stop()  # no process left running into the next test
            raise
        return daemon

    def close(self) -> None:
        if self._current is not None:
            self.exit_codes.append(self._current.stop())
            self._current = None


@pytest.fixture(scope="module", params=["uvicorn", "hypercorn"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           smollm2_model: Path) -> Iterator[Served]:
    served = Served(request.param, tmp_path_factory.mktemp(f"http-{request.param}"),
                    smollm2_model)
    try:
        yield served
    finally:
        served.close()
    assert served.exit_codes == [0] * len(served.exit_codes)


def test_a_stream_arrives_token_by_token_and_whole(served: Served) -> None:
    assert listen_backlog(served.daemon.port) == BACKLOG
    body = {**LONG, "max_tokens": 20, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", served.url + "/v1/chat/completions", json=body,
                      timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        first = time.monotonic()
        rest = [line for line in lines if line]
        # 20 steps of 50 ms: a server that buffered the response would deliver it at once.
        assert time.monotonic() - first > 10 * STEP_S
    assert rest[-1] == "data: [DONE]"
    assert json.loads(rest[-2][6:])["usage"]["completion_tokens"] == 20


def test_a_429_status_line_carries_its_reason_phrase(served: Served) -> None:
    """Two long streams of 3 choices each fill the 4 slots and 2 of the 3 waiting places, so
    2 more choices cannot queue now: 429 at once (more choices than the queue could ever hold
    are a 400, tests/http/test_limits.py). Read off the wire: httpx would fill in a missing
    phrase; vLLM's client (aiohttp) does not."""
    body = json.dumps({**SHORT, "n": 2}).encode()
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
    url = f"{served.url}/v1/chat/completions"
    with httpx.Client(timeout=60) as client, \
            client.stream("POST", url, json={**LONG, "n": 3}) as first, \
            client.stream("POST", url, json={**LONG, "n": 3}) as second:
        assert first.status_code == second.status_code == 200
        with socket.create_connection(("127.0.0.1", served.daemon.port), timeout=30) as sock:
            sock.sendall(head + body)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
    status, _, rest = answer.partition(b"\r\n")
    assert status == b"HTTP/1.1 429 Too Many Requests", answer
    assert b"\r\nretry-after: " in b"\r\n" + rest.lower(), answer


async def _hold_streams(client: httpx.AsyncClient, count: int, release: asyncio.Event) -> None:
    """Open `count` streams and keep them until `release`, then close the client (on HTTP/1.1
    each stream has its own connection; on HTTP/2 all share one, and closing it is what
    tells the server: httpx resets no stream it stops reading)."""
    started = [asyncio.Event() for _ in range(count)]
    async with client, asyncio.TaskGroup() as group:
        for event in started:
            group.create_task(_one_stream(client, event, release))
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 30)


async def _one_stream(client: httpx.AsyncClient, started: asyncio.Event,
                      release: asyncio.Event) -> None:
    async with client.stream("POST", "/v1/chat/completions", json=LONG) as response:
        assert response.status_code == 200
        # Held by reference: an `async for` left by `break` lets its generator be finalized,
        # which closes the response and so the stream; the cap then counted it out early.
        chunks = response.aiter_bytes()
        await anext(chunks)
        started.set()
        await release.wait()


async def _refused_beyond_the_cap(daemon: DaemonProcess, holder: httpx.AsyncClient,
                                  client: httpx.AsyncClient) -> httpx.Response:
    """Hold CAP streams on `holder` (closed afterwards); the answer to one more request on
    `client`, then the streams released and a request served again on `client` once their
    connections are counted out."""
    deadline = time.monotonic() + 30
    while daemon.metric("lengthwise_http_requests_open") > 0:  # an earlier test's streams
        assert time.monotonic() < deadline, "earlier requests were never counted out"
        await asyncio.sleep(0.05)
    release = asyncio.Event()
    holders = asyncio.create_task(_hold_streams(holder, CAP, release))
    while daemon.metric("lengthwise_running_jobs") < CAP:  # all CAP streams admitted
        assert not holders.done(), holders
        assert time.monotonic() < deadline, "the held streams were never all running"
        await asyncio.sleep(0.05)
    assert daemon.metric("lengthwise_http_requests_open") == CAP
    refused = await client.post("/v1/chat/completions", json=SHORT)
    assert (await client.get("/health")).status_code == 200  # probes are not counted
    release.set()
    await holders
    deadline = time.monotonic() + 20
    while (served := await client.post("/v1/chat/completions", json=SHORT)).status_code != 200:
        assert time.monotonic() < deadline, served.text
        await asyncio.sleep(0.1)
    return refused


@pytest.mark.asyncio
async def test_connections_beyond_the_cap_get_503_and_are_closed(served: Served) -> None:
    holder = httpx.AsyncClient(base_url=served.url, timeout=30)
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
        refused = await _refused_beyond_the_cap(served.daemon, holder, client)
    assert refused.status_code == 503, refused.text
    assert refused.reason_phrase == "Service Unavailable"
    assert refused.json()["error"]["code"] == "too_many_connections"
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.headers["connection"] == "close"


def _h2c(served: Served) -> httpx.AsyncClient:
    """HTTP/2 over cleartext with prior knowledge (no Upgrade round trip)."""
    return httpx.AsyncClient(base_url=served.url, http1=False, http2=True, timeout=30)


@pytest.mark.asyncio
async def test_hypercorn_serves_h2c_streams_side_by_side_and_caps_them(served: Served) -> None:
    if served.http != "hypercorn":
        pytest.skip("HTTP/2 is hypercorn's; uvicorn's refusal is tested below")
    body = {**LONG, "max_tokens": 10, "stream_options": {"include_usage": True}}

    async def stream(client: httpx.AsyncClient) -> list[str]:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.http_version == "HTTP/2"
            assert response.status_code == 200
            return [line async for line in response.aiter_lines() if line]

    async with _h2c(served) as client:
        both = await asyncio.gather(stream(client), stream(client))  # one connection
        for lines in both:
            assert lines[-1] == "data: [DONE]"
            assert json.loads(lines[-2][6:])["usage"]["completion_tokens"] == 10
        # The cap counts HTTP/2 streams (held on one connection); the 503's connection
        # survives the request body that follows it, and HTTP/2 has no Connection header.
        refused = await _refused_beyond_the_cap(served.daemon, _h2c(served), client)
    assert refused.http_version == "HTTP/2" and refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "too_many_connections"
    assert "connection" not in refused.headers


def test_hypercorn_upgrades_to_h2c(served: Served) -> None:
    if served.http != "hypercorn":
        pytest.skip("HTTP/2 is hypercorn's; uvicorn's refusal is tested below")
    h2c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    settings = h2c.initiate_upgrade_connection()
    with socket.create_connection(("127.0.0.1", served.daemon.port), timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\nConnection: Upgrade, "
                     b"HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: " + settings +
                     b"\r\n\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(65536)
        head, _, frames = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101 Switching Protocols\r\n"), head
        sock.sendall(h2c.data_to_send())  # the client's preface and settings
        status, body, ended = b"", b"", False
        while not ended:
            for event in h2c.receive_data(frames):
                if isinstance(event, h2.events.ResponseReceived) and event.stream_id == 1:
                    status = dict(event.headers)[b":status"]
                elif isinstance(event, h2.events.DataReceived) and event.stream_id == 1:
                    body += event.data
                ended = ended or (isinstance(event, h2.events.StreamEnded)
                                  and event.stream_id == 1)
            sock.sendall(h2c.data_to_send())
            frames = b"" if ended else sock.recv(65536)
            assert ended or frames, "hypercorn closed the upgraded connection"
    assert (status, json.loads(body)) == (b"200", {"status": "ok"})


@pytest.mark.asyncio
async def test_uvicorn_refuses_http2_at_once_and_answers_an_upgrade_in_http1(
        served: Served) -> None:
    if served.http != "uvicorn":
        pytest.skip("uvicorn's: hypercorn speaks HTTP/2 (tested above)")
    started = time.monotonic()
    async with _h2c(served) as client:
        # uvicorn answers the preface with an HTTP/1.1 400 and closes: httpx reads that as a
        # protocol error, or as a reset when the close wins the race with its read.
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            await client.get("/health")
    assert time.monotonic() - started < 10  # closed at once, not left to time out
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
        plain = await client.get("/health", headers={
            "connection": "Upgrade, HTTP2-Settings", "upgrade": "h2c",
            "http2-settings": "AAMAAABkAARAAAAAAAIAAAAA"})
    assert (plain.http_version, plain.status_code) == ("HTTP/1.1", 200)


def test_sigterm_drains_then_stops(served: Served) -> None:
    """Last (it stops the shared daemon): after SIGTERM new requests are refused, a stream
    that fits the drain limit finishes whole, one longer is cut ('abort', then [DONE]), a
    connection still sending its request gets server.graceful_timeout_s before the server
    closes it; then exit 0."""
    daemon = served.daemon
    body = {**LONG, "max_tokens": 1000, "stream_options": {"include_usage": True}}
    with (httpx.stream("POST", served.url + "/v1/chat/completions", json=body,
                       timeout=60) as long,
          httpx.stream("POST", served.url + "/v1/chat/completions",
                       json={**body, "max_tokens": 8}, timeout=60) as short,
          _sending_a_request(daemon.port) as sending):
        long_lines, short_lines = long.iter_lines(), short.iter_lines()
        assert next(long_lines).startswith("data: ") and next(short_lines).startswith("data: ")
        daemon.signal(signal.SIGTERM)
        assert _refused_once_draining(daemon) in (503, "connection refused")
        finished = [line for line in short_lines if line]
        cut = [line for line in long_lines if line]
        cut_at = time.monotonic()
        closed_after_s = _wait_closed(sending) - cut_at
    assert finished[-1] == "data: [DONE]" and '"completion_tokens":8' in finished[-2]
    assert '"finish_reason":"abort"' in cut[-3] and cut[-1] == "data: [DONE]"
    assert GRACE_S * 0.75 <= closed_after_s < GRACE_S + 10, closed_after_s
    assert daemon.proc.wait(30) == 0
    assert "drain timed out; aborting 1 jobs" in daemon.log()


@contextlib.contextmanager
def _sending_a_request(port: int) -> Iterator[socket.socket]:
    """A connection whose request is accepted but whose body never comes whole."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        yield sock


def _refused_once_draining(daemon: DaemonProcess) -> int | str:
    """A new request's answer once /health says the daemon drains (503)."""
    try:
        deadline = time.monotonic() + 30
        while httpx.get(daemon.base_url + "/health", timeout=10).status_code == 200:
            assert time.monotonic() < deadline, "SIGTERM not seen"
            time.sleep(0.05)
        return httpx.post(daemon.base_url + "/v1/chat/completions", json=SHORT,
                          timeout=10).status_code
    except httpx.ConnectError:
        return "connection refused"


def _wait_closed(sock: socket.socket) -> float:
    """When the server ended the connection (whatever it sent before)."""
    while sock.recv(65536):
        pass
    return time.monotonic()
