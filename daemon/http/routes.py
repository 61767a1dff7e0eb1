"""Route handlers: translate HTTP <-> a job for the core and its output stream, nothing else.

A request is read and checked here, tokenized, and handed to the core (Service.submit puts a
Submitted event in its inbox, or refuses at once: 429/503). The response then reads the job's
output stream; a client that leaves cancels the job (a Cancelled event)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from daemon.apikeys import ApiKey
from daemon.core.job import SamplingSpec, Slo
from daemon.core.ports import NotAccepting, QueueFull, SloUnreachable
from daemon.core.stream import JobEnd, TokenDelta
from daemon.http import chat, render, slo, tools, translate
from daemon.http import logprobs as lp
from daemon.http.auth import authorize
from daemon.http.errors import ApiError
from daemon.http.render import Answer, Choice, Options, Prompt
from daemon.http.responses import (
    ChatCompletion,
    Completion,
    ModelCard,
    ModelList,
)
from daemon.http.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    NamedToolChoice,
    SamplingFields,
)
from daemon.service import Service
from daemon.tokenizer import TemplateError
from daemon.toolcalls import ToolCallReader

_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def _json(obj: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(msgspec.json.encode(obj), status, headers, media_type="application/json")


class Routes:
    def __init__(self, service: Service) -> None:
        self.service = service

    # ---- admission ----------------------------------------------------------------------

    async def _read(self, request: Request, kind: type[msgspec.Struct]) -> Any:
        limit = self.service.config.server.max_body_bytes
        if int(request.headers.get("content-length") or 0) > limit:
            raise ApiError(413, f"request body exceeds {limit} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():  # a chunked body is cut as it streams in
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"request body exceeds {limit} bytes")
            chunks.append(chunk)
        return translate.decode_body(b"".join(chunks), kind)

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

    def _check_sampling(self, spec: SamplingSpec) -> None:
        translate.check_engine_limits(spec, self.service.tokenizer.vocab_size)
        try:
            self.service.check_sampling(spec)
        except ValueError as exc:
            raise translate.bad_request(str(exc), getattr(exc, "param", None)) from None

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
            svc.metrics.slo.refused(req.priority)
            raise slo.refused(SloUnreachable(refusal))
        return objective

    async def _admit(self, req: SamplingFields, prompts: list[Prompt], prefix: str,
                     objective: Slo | None, spec_for: Any) -> Answer:
        """Jobs for every prompt x n choices, all or none (`objective`: _objective's)."""
        svc = self.service
        if not svc.ready:
            raise ApiError(503, "the server is starting; retry shortly", "server_error",
                           retry_after_s=svc.retry_after_s())
        specs = [spec_for(p) for p in prompts]
        for spec in dict.fromkeys(specs):
            self._check_sampling(spec)
        n = req.n or 1
        jobs = []
        for p, spec in zip(prompts, specs, strict=True):
            for k in range(n):
                # n samples of one prompt: seed + k each, as vLLM's parallel sampling
                child = spec if k == 0 or spec.seed is None else \
                    msgspec.structs.replace(spec, seed=spec.seed + k)
                jobs.append((p, svc.new_job(p.ids, child, req.priority, prefix, p.messages,
                                            objective)))
        choices: list[Choice] = []
        try:
            for index, (p, job) in enumerate(jobs):
                choices.append(Choice(index, job.job_id, svc.submit(job), p.ids, p.text))
        except (NotAccepting, QueueFull, SloUnreachable) as exc:
            for c in choices:
                svc.scheduler.cancel(c.job_id)
            if isinstance(exc, NotAccepting):
                raise ApiError(503, f"{exc}", "server_error",
                               retry_after_s=svc.retry_after_s()) from None
            if isinstance(exc, SloUnreachable):
                svc.metrics.slo.refused(req.priority)
                raise slo.refused(exc) from None
            err = ApiError(429, f"server overloaded: {exc}; retry later", "rate_limit_error",
                           retry_after_s=svc.retry_after_s())
            err.headers[slo.DROPPED_HEADER] = slo.SATURATED
            raise err from None
        try:  # the headers carry the prediction, which the core asks for at once
            predicted = await choices[0].stream.prediction()
        except BaseException:  # the client left meanwhile
            for c in choices:
                svc.scheduler.cancel(c.job_id)
            raise
        answer_id = f"{prefix}-{req.request_id}" if req.request_id else choices[0].job_id
        answer = Answer(answer_id, choices, predicted)
        answer.headers.update(slo.latency_headers(svc.scheduler.forecast.latency(jobs[0][1])))
        return answer

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

    def _spec(self, req: SamplingFields, p: Prompt, max_new: int, top: int | None,
              echo: bool, tool_schema: str | None = None) -> SamplingSpec:
        prompt_lp = req.prompt_logprobs
        if prompt_lp is None and echo and top is not None:
            prompt_lp = top
        return translate.sampling_spec(req, max_new, logprobs=top, prompt_logprobs=prompt_lp,
                                       tool_schema=tool_schema)

    # ---- endpoints ----------------------------------------------------------------------

    async def chat_completions(self, request: Request) -> Response:
        key = authorize(self.service.keys, request, "api")
        req: ChatCompletionRequest = await self._read(request, ChatCompletionRequest)
        self._check_model(req.model)
        svc = self.service
        chosen = chat.check(req, svc.config.model.tool_call_parser)
        objective = self._objective(req, key, request)
        template, plain = translate.chat_messages(req)
        try:
            ids = await asyncio.to_thread(svc.tokenizer.encode_chat, template,
                                          add_special_tokens=bool(req.add_special_tokens),
                                          **chat.template_options(req))
        except TemplateError as exc:
            raise translate.bad_request(str(exc), "messages") from None
        ids = translate.truncate(ids, req.truncate_prompt_tokens, req.truncation_side)
        top = (req.top_logprobs or 0) if req.logprobs else None
        requested = req.max_completion_tokens if req.max_completion_tokens is not None \
            else req.max_tokens
        schema = tools.schema(req, chosen)

        def spec_for(p: Prompt) -> SamplingSpec:
            max_new = translate.max_tokens(requested, None, len(p.ids), svc.max_model_len,
                                           svc.config.limits)
            return self._spec(req, p, max_new, top, bool(req.echo), schema)

        readers = self._tool_readers(req, chosen, ids)
        answer = await self._admit(req, [Prompt(ids, "", plain)], "chatcmpl", objective,
                                   spec_for)
        opts = self._options(req, top, False)
        echo = chat.echo_text(req)
        if req.stream:
            return StreamingResponse(chat.stream(answer, opts, chosen, echo, svc.scheduler,
                                                 readers),
                                     media_type="text/event-stream",
                                     headers={**_SSE_HEADERS, **answer.headers})
        await self._collect(request, answer)
        body = ChatCompletion(answer.id, int(time.time()), opts.model,
                              [chat.whole(c, opts, chosen, echo,
                                          readers[c.index] if readers else None)
                               for c in answer.choices],
                              render.usage(answer.choices, answer.num_prompt_tokens))
        if req.return_token_ids:
            body.prompt_token_ids = ids
        return _json(body, headers=answer.headers)

    def _tool_readers(self, req: ChatCompletionRequest, chosen: str | NamedToolChoice,
                      ids: list[int]) -> list[ToolCallReader] | None:
        """tool_choice "auto" with a tool parser: one parser per choice (they keep state)."""
        parsing = self.service.tool_parsing
        if chosen != "auto" or parsing is None:
            return None
        body = msgspec.to_builtins(req)
        try:
            return [parsing.reader(body, ids) for _ in range(req.n or 1)]
        except ValueError as exc:  # vLLM's request model refused what its parser reads
            raise translate.bad_request(f"tool parser: {exc}", "tools") from None

    async def completions(self, request: Request) -> Response:
        key = authorize(self.service.keys, request, "api")
        req: CompletionRequest = await self._read(request, CompletionRequest)
        self._check_model(req.model)
        translate.check_request(req, bool(req.stream))
        objective = self._objective(req, key, request)
        tok = self.service.tokenizer
        add_special = True if req.add_special_tokens is None else req.add_special_tokens
        prompts = []
        for one in translate.completion_prompts(req):
            if isinstance(one, str):
                ids = await asyncio.to_thread(tok.encode, one, add_special)
                text = one
            else:
                translate.check_vocab(one, tok.vocab_size)
                ids, text = one, await asyncio.to_thread(tok.decode, one)
            ids = translate.truncate(ids, req.truncate_prompt_tokens, req.truncation_side)
            prompts.append(Prompt(ids, text, [{"role": "user", "content": text}]))
        top = req.logprobs
        echo = bool(req.echo)
        svc = self.service
        requested = 1 if echo and req.max_tokens == 0 else req.max_tokens

        def spec_for(p: Prompt) -> SamplingSpec:
            max_new = translate.max_tokens(requested, 16, len(p.ids), svc.max_model_len,
                                           svc.config.limits)
            return self._spec(req, p, max_new, top, echo)

        answer = await self._admit(req, prompts, "cmpl", objective, spec_for)
        opts = self._options(req, top, echo)
        if req.stream:
            return StreamingResponse(self._completion_stream(answer, opts),
                                     media_type="text/event-stream",
                                     headers={**_SSE_HEADERS, **answer.headers})
        await self._collect(request, answer)
        body = Completion(answer.id, int(time.time()), opts.model,
                          [render.completion_piece(c, opts, None, True, c.end)
                           for c in answer.choices],
                          render.usage(answer.choices, answer.num_prompt_tokens))
        return _json(body, headers=answer.headers)

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
