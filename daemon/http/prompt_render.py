"""`POST /v1/chat/completions/render` and `POST /v1/completions/render`: what a request's
prompt becomes (token ids, sampling settings), without generating, in vLLM's shape (its
GenerateRequest, vLLM's scale-out render endpoints: one for chat, a list of one per prompt
for completions). The request takes the generating route's own steps up to the job (checks,
chat template, truncation, max_tokens), so the ids are the ones a job would run.

vLLM serves these only with `--enable-scale-out` (403 without it); lengthwise always does.
`sampling_params` carries vLLM's field names, leaving out what equals vLLM's defaults; the
engine-side fields vLLM adds for its own generate endpoint (`output_kind`, `skip_clone`)
are not there: lengthwise has no such endpoint to hand the body to."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from daemon.core.job import SamplingSpec
from daemon.http import limits, prepare, translate
from daemon.http.auth import authorize
from daemon.http.render import Prompt
from daemon.http.routes import Routes
from daemon.http.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
    StreamOptions,
)


class SamplingOut(msgspec.Struct, omit_defaults=True):
    """A job's sampling settings under vLLM's SamplingParams names and defaults."""

    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] = []
    stop_token_ids: list[int] = []
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logprob_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] = []
    structured_outputs: dict[str, Any] | None = None
    watermarking: bool | None = None
    extra_args: dict[str, Any] | None = None


class Rendered(msgspec.Struct):
    """vLLM's GenerateRequest, as its render endpoints write it (every field)."""

    request_id: str
    token_ids: list[int]
    sampling_params: SamplingOut
    model: str | None
    stream: bool
    stream_options: StreamOptions | None
    cache_salt: str | None
    priority: int
    token_offsets: None = None
    features: None = None
    content_parts: None = None
    reasoning_ended: None = None
    reasoning_parser_kwargs: None = None
    return_token_ids: None = None
    output_mode: str = "tokens"
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None


_DEFAULTS = {f.name: f.default for f in msgspec.structs.fields(SamplingOut)}


def sampling(spec: SamplingSpec) -> SamplingOut:
    structured = None if spec.structured is None else {
        k: v for k, v in msgspec.structs.asdict(spec.structured).items()
        if v is not None and v is not False}
    full = SamplingOut(
        max_tokens=spec.max_tokens, temperature=spec.temperature, top_p=spec.top_p,
        top_k=spec.top_k, min_p=spec.min_p, presence_penalty=spec.presence_penalty,
        frequency_penalty=spec.frequency_penalty, repetition_penalty=spec.repetition_penalty,
        seed=spec.seed, stop=list(spec.stop), stop_token_ids=list(spec.stop_token_ids),
        include_stop_str_in_output=spec.include_stop_str_in_output,
        ignore_eos=spec.ignore_eos, min_tokens=spec.min_tokens, logprobs=spec.logprobs,
        prompt_logprobs=spec.prompt_logprobs,
        logprob_token_ids=list(spec.logprob_token_ids) if spec.logprob_token_ids else None,
        skip_special_tokens=spec.skip_special_tokens,
        spaces_between_special_tokens=spec.spaces_between_special_tokens,
        logit_bias=dict(spec.logit_bias) or None,
        allowed_token_ids=(list(spec.allowed_token_ids)
                           if spec.allowed_token_ids is not None else None),
        bad_words=list(spec.bad_words), structured_outputs=structured,
        watermarking=spec.watermarking, extra_args=dict(spec.extra_args or {}) or None)
    # left out by value (msgspec's omit_defaults goes by identity for floats)
    return SamplingOut(**{name: value for name, default in _DEFAULTS.items()
                          if (value := getattr(full, name)) != default})


def _rendered(req: SamplingFields, request_id: str, p: Prompt, spec: SamplingSpec,
              model: str) -> Rendered:
    return Rendered(request_id, p.ids, sampling(spec), req.model or model, bool(req.stream),
                    req.stream_options if req.stream else None, req.cache_salt, req.priority,
                    kv_transfer_params=req.kv_transfer_params,
                    ec_transfer_params=req.ec_transfer_params)


def _base_id(req: SamplingFields) -> str:
    return req.request_id or uuid.uuid4().hex


async def render_chat(routes: Routes, request: Request) -> Response:
    svc = routes.service
    authorize(svc.keys, request, "api")
    req: ChatCompletionRequest = await routes._read(request, ChatCompletionRequest)
    routes._check_model(req.model)
    limits.check_sampling(req, svc.request_limits, svc.config.scheduler.max_waiting)
    prepared = await routes._prepare(prepare.chat_request, req)
    body = _rendered(req, f"chatcmpl-{_base_id(req)}", prepared.prompts[0],
                     prepared.specs[0], svc.config.model.name)
    return Response(msgspec.json.encode(body), media_type="application/json")


async def render_completions(routes: Routes, request: Request) -> Response:
    svc = routes.service
    authorize(svc.keys, request, "api")
    req: CompletionRequest = await routes._read(request, CompletionRequest)
    routes._check_model(req.model)
    translate.check_request(req, bool(req.stream))
    limits.check_sampling(req, svc.request_limits, svc.config.scheduler.max_waiting,
                          limits.num_prompts(req, svc.request_limits))
    prepared = await routes._prepare(prepare.completion_request, req)
    base = f"cmpl-{_base_id(req)}"
    body = [_rendered(req, base if len(prepared.prompts) == 1 else f"{base}-{i}", p, spec,
                      svc.config.model.name)
            for i, (p, spec) in enumerate(zip(prepared.prompts, prepared.specs, strict=True))]
    return Response(msgspec.json.encode(body), media_type="application/json")
