"""POST /v1/responses, GET /v1/responses/{id}, POST /v1/responses/{id}/cancel: OpenAI's
Responses API with vLLM's meaning (vllm/entrypoints/openai/responses/), on the chat
route's job path: the request becomes chat messages and the chat template's prompt, then
one job admitted by Routes._admit like any chat request (predicted, ordered, preempted and
resumed by the policy, SLO headers honoured); its output stream becomes the response
object or the typed events (daemon/http/responses_output.py).

Stored responses (`store`, the default) live in a bounded in-memory store
(daemon/http/response_store.py). A background response runs as a task owned here: its
job is admitted (or refused) before the request returns, its status goes queued ->
in_progress (first token) -> completed / incomplete / failed / cancelled."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from daemon.core.stream import TokenDelta
from daemon.http import chat, limits, tools, translate
from daemon.http import logprobs as lp
from daemon.http import responses_input as inp
from daemon.http import responses_output as out
from daemon.http.auth import authorize
from daemon.http.errors import bad_request
from daemon.http.prepare import Prepared
from daemon.http.render import Prompt
from daemon.http.response_store import Entry, ResponseStore
from daemon.http.responses_objects import OutputItem, ResponseObject
from daemon.http.responses_schemas import ResponsesRequest, TextConfig, TextFormat
from daemon.http.responses_turn import Turn
from daemon.http.routes import Routes
from daemon.http.schemas import ChatCompletionRequest, ChatMessage
from daemon.tokenizer import TemplateError
from daemon.toolcalls import ToolCallReader

log = logging.getLogger(__name__)

_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
_CLOSE_TIMEOUT_S = 5.0


def _json(obj: object, headers: dict[str, str] | None = None) -> Response:
    return Response(msgspec.json.encode(obj), 200, headers, media_type="application/json")


class ResponsesApi:
    """The three routes, the store and the background responses' tasks."""

    def __init__(self, routes: Routes, store: ResponseStore | None = None) -> None:
        self.routes = routes
        self.service = routes.service
        self.store = store if store is not None else ResponseStore()
        self._background: dict[str, asyncio.Task[None]] = {}

    # ---- admission ----------------------------------------------------------------------

    def _previous(self, req: ResponsesRequest) -> tuple[list[ChatMessage], list[OutputItem]]:
        """The stored conversation and output `previous_response_id` continues."""
        if req.previous_response_id is None:
            return [], []
        entry = self.store.get(req.previous_response_id)
        if entry is None or entry.response is None:
            raise inp.not_found(req.previous_response_id)
        return entry.messages, entry.response.output

    async def _prompt(self, creq: ChatCompletionRequest
                      ) -> tuple[str, list[int], list[dict[str, str]]]:
        """(the chat template's text, its token ids, the text the predictor reads)."""
        template, plain = translate.chat_messages(creq)
        tok = self.service.tokenizer
        options = chat.template_options(creq)

        def render() -> tuple[str, list[int]]:  # one thread hop for both
            text = tok.render_chat(template, **options)
            return text, tok.encode(text, False)

        try:
            text, ids = await asyncio.to_thread(render)
        except TemplateError as exc:
            raise bad_request(str(exc), "input") from None
        limit = self.service.max_model_len
        if len(ids) >= limit:  # vLLM's words
            raise bad_request(f"The engine prompt length {len(ids)} exceeds the max_model_len "
                              f"{limit}. Please reduce prompt.", "input")
        return text, ids, plain

    def _max_tokens(self, req: ResponsesRequest, prompt_tokens: int) -> int:
        """vLLM's: the rest of the context, or less when the request asks (never a 400 for
        asking more); lengthwise's limits.default_max_tokens when it asks nothing."""
        room = self.service.max_model_len - prompt_tokens
        if req.max_output_tokens is not None:
            return min(req.max_output_tokens, room)
        default = self.service.config.limits.default_max_tokens
        return min(room, default) if default else room

    def _reader(self, creq: ChatCompletionRequest, ids: list[int]) -> ToolCallReader | None:
        parsing = self.service.tool_parsing
        if parsing is None or creq.tool_choice != "auto":
            return None
        body = msgspec.to_builtins(creq)
        try:
            return parsing.reader(body, ids)
        except ValueError as exc:  # vLLM's request model refused what its parser reads
            raise bad_request(f"tool parser: {exc}", "tools") from None

    async def _admit(self, request: Request, req: ResponsesRequest) -> Turn:
        routes, svc = self.routes, self.service
        key = authorize(svc.keys, request, "api")
        routes._check_model(req.model)
        chosen = inp.check(req)
        fields = inp.sampling_fields(req)
        limits.check_sampling(fields, svc.request_limits, svc.config.scheduler.max_waiting)
        objective = routes._objective(fields, key, request)
        history, previous_output = self._previous(req)
        messages = inp.conversation(req, history, previous_output)
        creq = inp.chat_request(req, messages, chosen)
        text, ids, plain = await self._prompt(creq)
        top = inp.logprobs(req)
        schema = tools.schema(creq, chosen)
        spec = translate.sampling_spec(fields, self._max_tokens(req, len(ids)), logprobs=top,
                                       prompt_logprobs=None,
                                       tool_schema=schema)
        translate.check_engine_limits(spec, svc.tokenizer.vocab_size)
        try:
            svc.check_sampling(spec)
        except ValueError as exc:
            raise bad_request(str(exc), getattr(exc, "param", None)) from None
        reader = self._reader(creq, ids)
        answer = await routes._admit(fields, Prepared([Prompt(ids, "", plain)], [spec], top),
                                     "resp", objective)
        shape = None if top is None else lp.Shape(top, False, svc.tokenizer.decode_one)
        return Turn(req, req.request_id or out.new_id("resp"), int(time.time()),
                    svc.config.model.name, spec, chosen, messages, text, answer, reader,
                    svc.tool_parsing is not None, shape, self._echoed_text(req, schema))

    def _echoed_text(self, req: ResponsesRequest, schema: str | None) -> TextConfig | None:
        """vLLM's tool parser replaces `text` by the schema that constrains a named or
        "required" tool choice (the response echoes that)."""
        if schema is None or self.service.tool_parsing is None:
            return req.text
        return TextConfig(format=TextFormat(type="json_schema", name="tool_calling_response",
                                            schema=msgspec.json.decode(schema), strict=True))

    # ---- endpoints ----------------------------------------------------------------------

    async def create(self, request: Request) -> Response:
        req: ResponsesRequest = await self.routes._read(request, ResponsesRequest)
        turn = await self._admit(request, req)
        headers = turn.answer.headers
        entry = Entry(turn.messages) if req.store else None
        if entry is not None:
            self.store.put(turn.response_id, entry)
        if req.background:
            assert entry is not None  # background needs store (checked)
            return self._start_background(turn, entry, headers)
        if req.stream:
            return StreamingResponse(self._stream(turn, entry), media_type="text/event-stream",
                                     headers={**_SSE_HEADERS, **headers})
        await self.routes._collect(request, turn.answer)
        end = turn.choice.end
        assert end is not None
        response = turn.response(turn.status(end), turn.whole_output())
        self._keep(turn.response_id, entry, response)
        return _json(response, headers)

    def _keep(self, response_id: str, entry: Entry | None, response: ResponseObject) -> None:
        """Store a finished response, unless it was cancelled meanwhile (vLLM's rule)."""
        if entry is None or (entry.response is not None and
                             entry.response.status == "cancelled"):
            return
        entry.response = response
        self.store.put(response_id, entry)

    async def _stream(self, turn: Turn, entry: Entry | None) -> AsyncIterator[bytes]:
        """The typed events of one answer (the store gets the final response)."""
        events = out.Events()
        c = turn.choice
        first_only = turn.req.parallel_tool_calls is False
        try:
            yield events.head(turn.response("in_progress"))
            async for _, item in turn.answer.outputs():
                if isinstance(item, TokenDelta):
                    c.take(item)
                    if turn.reader is not None:
                        yield events.parsed(turn.reader.delta(item.text, item.token_ids,
                                                              False), first_only)
                    elif not turn.constrained:
                        yield events.text(item.text, out.logprobs(
                            item.token_ids, item.logprobs or [], turn.shape))
                    continue
                c.end = item
                if turn.status(item) == "failed":  # an engine error, or shed for an SLO
                    if entry is not None:
                        self._keep(turn.response_id, entry, turn.response("failed"))
                    yield events.error(item.error or f"dropped: {item.dropped}")
                    return
                if turn.reader is not None:
                    yield events.parsed(turn.reader.delta("", [], True), first_only)
                elif turn.constrained:
                    yield events.calls(turn.calls())
            yield events.close()
            assert c.end is not None
            response = turn.response(turn.status(c.end), events.items)
            self._keep(turn.response_id, entry, response)
            yield events.completed(response)
        finally:
            turn.answer.cancel_rest(self.service.scheduler)

    # ---- background ---------------------------------------------------------------------

    def _start_background(self, turn: Turn, entry: Entry, headers: dict[str, str]
                          ) -> Response:
        """The job is admitted; a task owned here reads it. A streamed one records its
        events in the store and the client reads them from there (as GET ?stream=true)."""
        entry.response = turn.response("queued")
        if turn.req.stream:
            entry.events = []
        self.store.put(turn.response_id, entry)
        task = asyncio.create_task(self._run_background(turn, entry),
                                   name=f"background:{turn.response_id}")
        self._background[turn.response_id] = task
        task.add_done_callback(lambda _: self._background.pop(turn.response_id, None))
        if turn.req.stream:
            return StreamingResponse(self._replay(entry, 0), media_type="text/event-stream",
                                     headers={**_SSE_HEADERS, **headers})
        return _json(entry.response, headers)

    async def _run_background(self, turn: Turn, entry: Entry) -> None:
        try:
            if entry.events is not None:
                async for chunk in self._stream(turn, entry):
                    # one stored item per event (a chunk may hold several; JSON data
                    # holds no blank line), so starting_after counts events
                    for event in chunk.split(b"\n\n")[:-1]:
                        self.store.add_event(turn.response_id, entry, event + b"\n\n")
            else:
                await self._collect_background(turn, entry)
        except Exception:  # a failed response is the client's to read, not the daemon's
            log.exception("background response %s failed", turn.response_id)
            self._keep(turn.response_id, entry, turn.response("failed"))
        finally:
            turn.answer.cancel_rest(self.service.scheduler)
            entry.finished = True
            entry.changed.set()

    async def _collect_background(self, turn: Turn, entry: Entry) -> None:
        c = turn.choice
        async for _, item in turn.answer.outputs():
            if isinstance(item, TokenDelta):
                c.take(item)
                if entry.response is not None and entry.response.status == "queued":
                    entry.response = msgspec.structs.replace(entry.response,
                                                             status="in_progress")
                continue
            c.end = item
        assert c.end is not None
        status = turn.status(c.end)
        self._keep(turn.response_id, entry,
                   turn.response(status, turn.whole_output() if status != "failed" else []))

    async def _replay(self, entry: Entry, start: int) -> AsyncIterator[bytes]:
        """A background stream's events from index `start`, then as they come, until the
        response ends (completed, failed or cancelled)."""
        index = start
        while True:
            entry.changed.clear()
            events = entry.events or []
            while index < len(events):
                yield events[index]
                index += 1
            if entry.finished:
                return
            await entry.changed.wait()

    # ---- retrieve, cancel ---------------------------------------------------------------

    def _stored(self, request: Request) -> tuple[str, Entry, ResponseObject]:
        authorize(self.service.keys, request, "api")
        response_id = request.path_params["response_id"]
        entry = self.store.get(response_id)
        if entry is None or entry.response is None:
            raise inp.not_found(response_id)
        return response_id, entry, entry.response

    async def retrieve(self, request: Request) -> Response:
        response_id, entry, response = self._stored(request)
        # Both parameters are checked whether or not they are used, as vLLM's route does.
        stream = request.query_params.get("stream", "false").lower()
        if stream not in ("true", "false", "1", "0"):
            raise bad_request("'stream' must be true or false", "stream")
        after = request.query_params.get("starting_after")
        try:
            start = 0 if after is None else int(after) + 1
        except ValueError:
            raise bad_request("'starting_after' must be an integer", "starting_after") from None
        if stream in ("false", "0"):
            return _json(response)
        if entry.events is None:  # vLLM keeps events of background streams only
            raise bad_request(f"Unknown response_id: {response_id}", "response_id")
        return StreamingResponse(self._replay(entry, max(start, 0)),
                                 media_type="text/event-stream", headers=_SSE_HEADERS)

    async def cancel(self, request: Request) -> Response:
        response_id, entry, response = self._stored(request)
        if response.status not in ("queued", "in_progress"):
            raise bad_request("Cannot cancel a synchronous response.", "response_id")
        entry.response = msgspec.structs.replace(response, status="cancelled")
        self.store.put(response_id, entry)
        task = self._background.get(response_id)
        if task is not None:
            task.cancel()  # its job is cancelled as the task ends
            await asyncio.wait({task}, timeout=_CLOSE_TIMEOUT_S)
        return _json(entry.response)

    async def close(self) -> None:
        """Cancel the background responses still running (at shutdown, after the drain)."""
        tasks = list(self._background.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_CLOSE_TIMEOUT_S)
