"""Route handlers: translate HTTP <-> a job for the core and its output stream, nothing else.

A request is read and checked here (its size first: limits.py; what walks its contents and
tokenizes it runs in a worker thread: prepare.py), and handed to the core (Service.submit puts a
Submitted event in its inbox, or refuses at once: 429/503). The response then reads the job's
output stream; a client that leaves cancels the job (a Cancelled event)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from daemon.apikeys import ApiKey
from daemon.core.job import Job, SamplingSpec, Slo
from daemon.core.ports import NotAccepting, QueueFull, SloUnreachable
from daemon.core.stream import JobEnd, TokenDelta
from daemon.http import chat, limits, prepare, render, slo, translate
from daemon.http import logprobs as lp
from daemon.http.auth import authorize
from daemon.http.errors import ApiError
from daemon.http.prepare import Prepared
from daemon.http.render import Answer, Choice, Options, Prompt
from daemon.http.responses import (
    ChatCompletion,
    Completion,
    ModelCard,
    ModelList,
)
from daemon.http.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields
from daemon.service import Service

_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
_ADMIT_CHUNK = 64  # jobs made, or submitted, per turn of the event loop
_RENDER_ON_LOOP = 16  # whole answers of more choices are built off the loop
_PREPARING = 2  # requests prepared (tokenized, checked) at once, each in a worker thread


def _json(obj: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(msgspec.json.encode(obj), status, headers, media_type="application/json")


async def _whole(body: Callable[[], object], num_choices: int, headers: dict[str, str]
                 ) -> Response:
    """A whole answer's response; built in a worker thread when it has many choices (their
    number is the client's; their jobs have ended, so nothing changes them meanwhile)."""
    if num_choices <= _RENDER_ON_LOOP:
        return _json(body(), headers=headers)
    content = await asyncio.to_thread(lambda: msgspec.json.encode(body()))
    return Response(content, 200, headers, media_type="application/json")


class Routes:
    def __init__(self, service: Service) -> None:
        self.service = service
        self.bodies = limits.Bodies()
        self._preparing = asyncio.Semaphore(_PREPARING)
        self._admitting = asyncio.Lock()  # one request's jobs submitted at a time (_admit)

    # ---- admission ----------------------------------------------------------------------

    async def _read(self, request: Request, kind: type[msgspec.Struct]) -> Any:
        return await self.bodies.read(request, kind, self.service.config.server.max_body_bytes)

    def _check_model(self, name: str | None) -> None:
        served = self.service.config.model.name
        if name is not None and name != served:
            raise translate.unknown_model(name, served)

    def _check_priority(self, priority: int, key: ApiKey | None) -> None:
        """Keys without a range of their own may not ask for a more urgent class than 0."""
        translate.check_priority(priority, self.service.config.limits)
        if key is None:
            return
        limits = self.service.config.limits
        low, high = key.priority_range or (max(limits.priority_min, 0), limits.priority_max)
        if not low <= priority <= high:
            raise ApiError(403, f"key {key.name!r} may use priority {low}..{high} only",
                           "permission_error", "priority")

    def _check_ready(self) -> None:
        if not self.service.ready:
            raise ApiError(503, "the server is starting; retry shortly", "server_error",
                           retry_after_s=self.service.retry_after_s())

    def _objective(self, req: SamplingFields, key: ApiKey | None, request: Request
                   ) -> Slo | None:
        """The request's priority checked and its latency objective (headers, key, class).
        One that cannot be met even with an empty prompt gets its 429 here, before the
        prompt is tokenized (the wait ahead of it does not depend on its prompt, and a
        bigger KV footprint only waits longer to fit), so a refusal leaves in milliseconds
        under load; admission tests it again, prompt included, when it submits."""
        svc = self.service
        self._check_priority(req.priority, key)
        objective = slo.objective(request.headers, req.priority, key, svc.config.slo.classes)
        if objective is None or not svc.ready or not svc.config.slo.enforce:
            return objective
        probe = svc.new_job([], SamplingSpec(max_tokens=1), req.priority, "probe", None,
                            objective)
        refusal = svc.scheduler.forecast.refusal(probe)
        if refusal is not None:
            svc.metrics.slo.refused(req.priority, refusal)
            raise slo.refused(SloUnreachable(refusal))
        return objective

    async def _prepare(self, build: Callable[[Service, Any], Prepared], req: SamplingFields
                       ) -> Prepared:
        """`build` (prepare.py) in a worker thread, at most _PREPARING at once: it is mostly
        Python, and each thread more that wants the GIL delays the event loop's next turn
        by up to a switch interval (5 ms); what the tokenizer runs outside it is short."""
        async with self._preparing:
            return await asyncio.to_thread(build, self.service, req)

    async def _admit(self, req: SamplingFields, prepared: Prepared, prefix: str,
                     objective: Slo | None) -> Answer:
        """Jobs for every prompt x n choices, all or none (`objective`: _objective's). How
        many is the client's choice (limits.check_sequences bounds it): they are made and
        submitted a chunk at a time, the loop serving others in between; one request
        submits at a time, so that requests arriving together do not take each other's
        room half-way and all fail."""
        svc = self.service
        n = req.n or 1
        jobs: list[tuple[Prompt, Job]] = []
        for index in range(len(prepared.prompts) * n):
            if index and index % _ADMIT_CHUNK == 0:
                await asyncio.sleep(0)
            p, spec = prepared.prompts[index // n], prepared.specs[index // n]
            if index % n and spec.seed is not None:
                # n samples of one prompt: seed + k each, as vLLM's parallel sampling
                spec = msgspec.structs.replace(spec, seed=spec.seed + index % n)
            jobs.append((p, svc.new_job(p.ids, spec, req.priority, prefix, p.messages,
                                        objective)))
        choices: list[Choice] = []
        async with self._admitting:
            self._check_ready()
            try:
                for index, (p, job) in enumerate(jobs):
                    if index and index % _ADMIT_CHUNK == 0:
                        await asyncio.sleep(0)
                    choices.append(Choice(index, job.job_id, svc.submit(job), p.ids, p.text))
            except (NotAccepting, QueueFull, SloUnreachable) as exc:
                self._cancel(choices)
                raise self._refusal(exc, req.priority) from None
            except BaseException:  # the client left between two chunks
                self._cancel(choices)
                raise
        try:  # the headers carry the prediction, which the core asks for at once
            predicted = await choices[0].stream.prediction()
        except BaseException:  # the client left meanwhile
            self._cancel(choices)
            raise
        answer_id = f"{prefix}-{req.request_id}" if req.request_id else choices[0].job_id
        answer = Answer(answer_id, choices, predicted)
        answer.headers.update(slo.latency_headers(svc.scheduler.forecast.latency(jobs[0][1])))
        return answer

    def _cancel(self, choices: list[Choice]) -> None:
        for c in choices:
            self.service.scheduler.cancel(c.job_id)

    def _refusal(self, exc: NotAccepting | QueueFull | SloUnreachable, priority: int
                 ) -> ApiError:
        """What waiting can cure: 503 (not accepting), 429 (queue full, objective out of
        reach now), with Retry-After."""
        svc = self.service
        if isinstance(exc, NotAccepting):
            return ApiError(503, f"{exc}", "server_error", retry_after_s=svc.retry_after_s())
        if isinstance(exc, SloUnreachable):
            svc.metrics.slo.refused(priority, exc.refusal)
            return slo.refused(exc)
        err = ApiError(429, f"server overloaded: {exc}; retry later", "rate_limit_error",
                       retry_after_s=svc.retry_after_s())
        err.headers[slo.DROPPED_HEADER] = slo.SATURATED
        return err

    def _cancel_rest(self, answer: Answer) -> None:
        answer.cancel_rest(self.service.scheduler)

    async def _abort_on_disconnect(self, request: Request, answer: Answer) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        self._cancel_rest(answer)

    async def _collect(self, request: Request, answer: Answer) -> None:
        """Whole answer for a non-streaming request; a client that leaves aborts the jobs."""
        watcher = asyncio.create_task(self._abort_on_disconnect(request, answer))
        try:
            async for choice, item in answer.outputs():
                if isinstance(item, TokenDelta):
                    choice.take(item)
                    continue
                choice.end = item
                if item.finish_reason == "shed":
                    raise slo.dropped(item, self.service.retry_after_s())
                if item.error is not None and self.service.failed.is_set():
                    raise ApiError(503, item.error, "server_error",
                                   retry_after_s=self.service.retry_after_s())
                if item.error is not None:
                    raise ApiError(500, item.error, "server_error")
        finally:
            watcher.cancel()
            self._cancel_rest(answer)

    def _shape(self, top: int | None, req: SamplingFields) -> lp.Shape | None:
        if top is None and not req.logprob_token_ids:
            return None
        tok = self.service.tokenizer
        return lp.Shape(top if top is not None else 0, bool(req.return_tokens_as_token_ids),
                        tok.decode_one, bool(req.logprob_token_ids))

    def _options(self, req: SamplingFields, top: int | None, echo: bool) -> Options:
        so = req.stream_options
        include = bool(req.stream and so is not None and so.include_usage)
        return Options(req.model or self.service.config.model.name, self._shape(top, req),
                       echo=echo, echo_only=echo and req.max_tokens == 0,
                       return_token_ids=bool(req.return_token_ids), include_usage=include,
                       continuous_usage=include and bool(so and so.continuous_usage_stats))

    # ---- endpoints ----------------------------------------------------------------------

    async def chat_completions(self, request: Request) -> Response:
        key = authorize(self.service.keys, request, "api")
        req: ChatCompletionRequest = await self._read(request, ChatCompletionRequest)
        svc = self.service
        answer, prepared = await self.admit_chat(request, req, key)
        opts = self._options(req, prepared.top, False)
        echo = chat.echo_text(req)
        chosen, readers = prepared.chosen, prepared.readers
        if req.stream:
            return StreamingResponse(chat.stream(answer, opts, chosen, echo, svc.scheduler,
                                                 readers),
                                     media_type="text/event-stream",
                                     headers={**_SSE_HEADERS, **answer.headers})
        await self._collect(request, answer)

        def body() -> ChatCompletion:
            whole = ChatCompletion(answer.id, int(time.time()), opts.model,
                                   [chat.whole(c, opts, chosen, echo,
                                               readers[c.index] if readers else None)
                                    for c in answer.choices],
                                   render.usage(answer.choices, answer.num_prompt_tokens))
            if req.return_token_ids:
                whole.prompt_token_ids = prepared.prompts[0].ids
            return whole

        return await _whole(body, len(answer.choices), answer.headers)

    async def admit_chat(self, request: Request, req: ChatCompletionRequest,
                         key: ApiKey | None) -> tuple[Answer, Prepared]:
        """A chat request checked, prepared and admitted: the chat route's path to a job
        (/v1/messages takes it too, with the chat request its request means)."""
        self._check_model(req.model)
        svc = self.service
        limits.check_sampling(req, svc.request_limits, svc.config.scheduler.max_waiting)
        objective = self._objective(req, key, request)
        self._check_ready()
        prepared = await self._prepare(prepare.chat_request, req)
        return await self._admit(req, prepared, "chatcmpl", objective), prepared

    async def completions(self, request: Request) -> Response:
        key = authorize(self.service.keys, request, "api")
        req: CompletionRequest = await self._read(request, CompletionRequest)
        self._check_model(req.model)
        translate.check_request(req, bool(req.stream))
        svc = self.service
        limits.check_sampling(req, svc.request_limits, svc.config.scheduler.max_waiting,
                              limits.num_prompts(req, svc.request_limits))
        objective = self._objective(req, key, request)
        self._check_ready()
        prepared = await self._prepare(prepare.completion_request, req)
        answer = await self._admit(req, prepared, "cmpl", objective)
        opts = self._options(req, prepared.top, bool(req.echo))
        if req.stream:
            return StreamingResponse(self._completion_stream(answer, opts),
                                     media_type="text/event-stream",
                                     headers={**_SSE_HEADERS, **answer.headers})
        await self._collect(request, answer)

        def body() -> Completion:
            return Completion(answer.id, int(time.time()), opts.model,
                              [render.completion_piece(c, opts, None, True, c.end)
                               for c in answer.choices],
                              render.usage(answer.choices, answer.num_prompt_tokens))

        return await _whole(body, len(answer.choices), answer.headers)

    async def _completion_stream(self, answer: Answer, opts: Options) -> AsyncIterator[bytes]:
        created = int(time.time())
        first = {c.index: True for c in answer.choices}
        try:
            async for c, item in answer.outputs():
                if isinstance(item, JobEnd) and item.error is not None:
                    yield render.error_event(item.error)
                    continue
                delta = item if isinstance(item, TokenDelta) else None
                if delta is not None:
                    c.take(delta)
                    if not delta.text and not delta.token_ids and not first[c.index]:
                        continue
                piece = render.completion_piece(
                    c, opts, delta or TokenDelta("", [], []), first[c.index],
                    item if isinstance(item, JobEnd) else None)
                first[c.index] = False
                usage = render.usage(answer.choices, answer.num_prompt_tokens) \
                    if opts.continuous_usage else None
                yield render.sse(Completion(answer.id, created, opts.model, [piece], usage))
            if opts.include_usage:
                yield render.sse(Completion(answer.id, created, opts.model, [],
                                            render.usage(answer.choices,
                                                         answer.num_prompt_tokens)))
            yield b"data: [DONE]\n\n"
        finally:
            self._cancel_rest(answer)

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
