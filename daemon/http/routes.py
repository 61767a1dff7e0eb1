"""Route handlers: translate HTTP <-> a job for the core and its output stream, nothing else.

A request is read and checked here, tokenized, and handed to the core (Service.submit puts a
Submitted event in its inbox, or refuses at once: 429/503). The response then reads the job's
output stream; a client that leaves cancels the job (a Cancelled event)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from daemon.apikeys import ApiKey
from daemon.core.scheduler import NotAccepting, QueueFull, SloUnreachable
from daemon.core.stream import JobEnd, OutputStream, TokenDelta
from daemon.http import slo, translate
from daemon.http.auth import authorize
from daemon.http.errors import ApiError
from daemon.http.schemas import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessageOut,
    Completion,
    CompletionChoice,
    CompletionRequest,
    Delta,
    ErrorBody,
    ErrorInfo,
    ModelCard,
    ModelList,
    SamplingFields,
    Usage,
)
from daemon.service import Service
from daemon.tokenizer import TemplateError

_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def _json(obj: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(msgspec.json.encode(obj), status, headers, media_type="application/json")


def _sse(obj: object) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


def _error_event(message: str) -> bytes:
    """A job that failed mid-stream: an OpenAI error object as the last data event."""
    return _sse(ErrorBody(ErrorInfo(message, "server_error")))


class _Answer:
    """One admitted request as the response sees it: its id, prompt size and output."""

    __slots__ = ("headers", "job_id", "num_prompt_tokens", "stream")

    def __init__(self, job_id: str, num_prompt_tokens: int, stream: OutputStream,
                 predicted: float | None) -> None:
        self.job_id = job_id
        self.num_prompt_tokens = num_prompt_tokens
        self.stream = stream
        self.headers = {"x-request-id": job_id}
        if predicted is not None:
            self.headers["x-lengthwise-predicted-tokens"] = f"{predicted:.0f}"

    def usage(self) -> Usage:
        out = self.stream.num_tokens
        return Usage(self.num_prompt_tokens, out, self.num_prompt_tokens + out)

    async def outputs(self) -> AsyncIterator[TokenDelta | JobEnd]:
        while True:
            item = await self.stream.next()
            yield item
            if isinstance(item, JobEnd):
                return


class Routes:
    def __init__(self, service: Service) -> None:
        self.service = service

    # ---- admission ----------------------------------------------------------------------

    async def _read(self, request: Request, kind: type[msgspec.Struct]) -> msgspec.Struct:
        limit = self.service.config.server.max_body_bytes
        if int(request.headers.get("content-length") or 0) > limit:
            raise ApiError(413, f"request body exceeds {limit} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():  # a chunked body is cut as it streams in
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"request body exceeds {limit} bytes")
            chunks.append(chunk)
        req: msgspec.Struct = translate.decode_body(b"".join(chunks), kind)
        return req

    def _check_model(self, name: str) -> None:
        served = self.service.config.model.name
        if name != served:
            raise translate.unknown_model(name, served)

    def _check_priority(self, priority: int, key: ApiKey | None) -> None:
        """Keys without a range of their own may not ask for a more urgent class than 0."""
        if key is None:
            return
        limits = self.service.config.limits
        low, high = key.priority_range or (max(limits.priority_min, 0), limits.priority_max)
        if not low <= priority <= high:
            raise ApiError(403, f"key {key.name!r} may use priority {low}..{high} only",
                           "permission_error", "priority")

    async def _admit(self, req: SamplingFields, prompt: list[int], requested_max: int | None,
                     prefix: str, messages: list[dict[str, str]], key: ApiKey | None,
                     request: Request) -> _Answer:
        svc = self.service
        if not svc.ready:
            raise ApiError(503, "the server is starting; retry shortly", "server_error",
                           retry_after_s=svc.retry_after_s())
        sampling = translate.sampling_spec(req, requested_max, len(prompt), svc.max_model_len,
                                           svc.config.limits)
        self._check_priority(req.priority, key)
        objective = slo.objective(request.headers, req.priority, key, svc.config.slo.classes)
        try:
            job = svc.new_job(prompt, sampling, req.priority, prefix, messages, objective)
            stream = svc.submit(job)
        except NotAccepting as exc:
            raise ApiError(503, f"{exc}", "server_error",
                           retry_after_s=svc.retry_after_s()) from None
        except SloUnreachable as exc:
            svc.metrics.slo.refused(req.priority)
            raise slo.refused(exc) from None
        except QueueFull as exc:
            err = ApiError(429, f"server overloaded: {exc}; retry later", "rate_limit_error",
                           retry_after_s=svc.retry_after_s())
            err.headers[slo.DROPPED_HEADER] = slo.SATURATED
            raise err from None
        try:  # the headers carry the prediction, which the core asks for at once
            predicted = await stream.prediction()
        except BaseException:  # the client left meanwhile
            svc.scheduler.cancel(job.job_id)
            raise
        answer = _Answer(job.job_id, job.num_prompt_tokens, stream, predicted)
        answer.headers.update(slo.latency_headers(svc.scheduler.forecast.latency(job)))
        return answer

    async def _abort_on_disconnect(self, request: Request, answer: _Answer) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        self.service.scheduler.cancel(answer.job_id)

    async def _collect(self, request: Request, answer: _Answer) -> tuple[str, JobEnd]:
        """Whole answer for a non-streaming request; a client that leaves aborts the job."""
        watcher = asyncio.create_task(self._abort_on_disconnect(request, answer))
        pieces: list[str] = []
        try:
            async for item in answer.outputs():
                if isinstance(item, JobEnd):
                    if item.finish_reason == "shed":
                        raise slo.dropped(item, self.service.retry_after_s())
                    if item.error is not None and self.service.failed.is_set():
                        raise ApiError(503, item.error, "server_error",
                                       retry_after_s=self.service.retry_after_s())
                    if item.error is not None:
                        raise ApiError(500, item.error, "server_error")
                    return "".join(pieces), item
                pieces.append(item.text)
        finally:
            watcher.cancel()
            if not answer.stream.ended:
                self.service.scheduler.cancel(answer.job_id)
        raise AssertionError("output stream ended without JobEnd")

    # ---- endpoints ----------------------------------------------------------------------

    async def chat_completions(self, request: Request) -> Response:
        key = authorize(self.service.keys, request, "api")
        req = await self._read(request, ChatCompletionRequest)
        assert isinstance(req, ChatCompletionRequest)
        self._check_model(req.model)
        messages = translate.chat_messages(req)
        try:
            prompt = await asyncio.to_thread(self.service.tokenizer.encode_chat, messages)
        except TemplateError as exc:
            raise translate.bad_request(str(exc), "messages") from None
        requested = req.max_completion_tokens if req.max_completion_tokens is not None \
            else req.max_tokens
        answer = await self._admit(req, prompt, requested, "chatcmpl", messages, key, request)
        if req.stream:
            return StreamingResponse(self._chat_stream(answer, req),
                                     media_type="text/event-stream",
                                     headers={**_SSE_HEADERS, **answer.headers})
        text, end = await self._collect(request, answer)
        body = ChatCompletion(id=answer.job_id, created=int(time.time()), model=req.model,
                              choices=[ChatChoice(0, ChatMessageOut("assistant", text),
                                                  end.finish_reason)],
                              usage=answer.usage())
        return _json(body, headers=answer.headers)

    def _chat_stream(self, answer: _Answer, req: ChatCompletionRequest) -> AsyncIterator[bytes]:
        created = int(time.time())

        def chunk(choices: list[ChatChunkChoice], usage: Usage | None = None) -> bytes:
            return _sse(ChatCompletionChunk(answer.job_id, created, req.model, choices, usage))

        def render(item: TokenDelta | JobEnd, first: bool) -> bytes:
            # The role chunk goes with the first output, as vLLM does: clients time TTFT
            # from the first chunk.
            head = chunk([ChatChunkChoice(0, Delta(role="assistant", content=""))]) if first \
                else b""
            if isinstance(item, TokenDelta):
                return head + (chunk([ChatChunkChoice(0, Delta(content=item.text))])
                               if item.text else b"")
            if item.error is not None:
                return head + _error_event(item.error)
            return head + chunk([ChatChunkChoice(0, Delta(), item.finish_reason)])

        return self._stream(answer, req, render, lambda: chunk([], answer.usage()))

    async def completions(self, request: Request) -> Response:
        key = authorize(self.service.keys, request, "api")
        req = await self._read(request, CompletionRequest)
        assert isinstance(req, CompletionRequest)
        self._check_model(req.model)
        prompt = translate.completion_prompt(req)
        tokenizer = self.service.tokenizer
        if isinstance(prompt, str):
            text, prompt = prompt, await asyncio.to_thread(tokenizer.encode, prompt)
        else:
            translate.check_vocab(prompt, tokenizer.vocab_size)
            text = await asyncio.to_thread(tokenizer.decode, prompt)
        answer = await self._admit(req, prompt, req.max_tokens, "cmpl",
                                   [{"role": "user", "content": text}], key, request)
        if req.stream:
            return StreamingResponse(self._completion_stream(answer, req),
                                     media_type="text/event-stream",
                                     headers={**_SSE_HEADERS, **answer.headers})
        text, end = await self._collect(request, answer)
        body = Completion(answer.job_id, int(time.time()), req.model,
                          [CompletionChoice(0, text, end.finish_reason)], answer.usage())
        return _json(body, headers=answer.headers)

    def _completion_stream(self, answer: _Answer, req: CompletionRequest
                           ) -> AsyncIterator[bytes]:
        created = int(time.time())

        def chunk(choices: list[CompletionChoice], usage: Usage | None = None) -> bytes:
            return _sse(Completion(answer.job_id, created, req.model, choices, usage))

        def render(item: TokenDelta | JobEnd, first: bool) -> bytes:
            if isinstance(item, TokenDelta):
                return chunk([CompletionChoice(0, item.text)]) if item.text else b""
            if item.error is not None:
                return _error_event(item.error)
            return chunk([CompletionChoice(0, "", item.finish_reason)])

        return self._stream(answer, req, render, lambda: chunk([], answer.usage()))

    async def _stream(self, answer: _Answer, req: SamplingFields,
                      render: Callable[[TokenDelta | JobEnd, bool], bytes],
                      usage: Callable[[], bytes]) -> AsyncIterator[bytes]:
        """SSE for one job, either endpoint: every output as `render` shapes it, the usage
        chunk when asked for, then [DONE]."""
        try:
            first = True
            async for item in answer.outputs():
                if data := render(item, first):
                    yield data
                first = False
            if req.stream_options is not None and req.stream_options.include_usage:
                yield usage()
            yield b"data: [DONE]\n\n"
        finally:
            if not answer.stream.ended:  # the client went away
                self.service.scheduler.cancel(answer.job_id)

    async def models(self, request: Request) -> Response:
        authorize(self.service.keys, request, "api")
        svc = self.service
        card = ModelCard(id=svc.config.model.name, created=int(time.time()),
                         max_model_len=svc.max_model_len)
        return _json(ModelList([card]))

    def authorize_monitoring(self, request: Request) -> None:
        if self.service.config.server.protect_monitoring:
            authorize(self.service.keys, request, "monitoring")

    async def health(self, request: Request) -> Response:
        self.authorize_monitoring(request)
        if not self.service.ready:
            return _json({"status": "starting"}, 503)
        if self.service.failed.is_set():
            return _json({"status": "failed", "executors_down": self.service.executors_down()},
                         503)
        if not self.service.scheduler.accepting:
            return _json({"status": "draining"}, 503)
        if down := self.service.executors_down():
            # Requests are still accepted: they wait and run once an engine is back.
            return _json({"status": "engine down", "executors_down": down}, 503)
        return _json({"status": "ok"})
