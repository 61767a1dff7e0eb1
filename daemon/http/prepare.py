"""A generation request's prompts and sampling settings, built from its decoded body: all
the work whose amount the client chooses (messages, tools, prompts, logit_bias, stop and
bad words walked; the chat template rendered; prompts tokenized; the engines' own checks,
which tokenize bad words and compile grammars). routes.py runs it in a worker thread, after
limits.py has bounded the request, so that none of it runs on the event loop."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from daemon.core.job import SamplingSpec
from daemon.http import chat, tools, translate
from daemon.http.render import Prompt
from daemon.http.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    NamedToolChoice,
    SamplingFields,
)
from daemon.service import Service
from daemon.tokenizer import TemplateError
from daemon.toolcalls import ToolCallReader


@dataclass(slots=True)
class Prepared:
    """What admission needs: the prompts, one spec each (they differ in max_tokens only),
    the logprobs asked per token, the chat's tool choice and its parsers (one per choice)."""

    prompts: list[Prompt]
    specs: list[SamplingSpec]
    top: int | None
    chosen: str | NamedToolChoice = "none"
    readers: list[ToolCallReader] | None = None


def chat_request(svc: Service, req: ChatCompletionRequest) -> Prepared:
    chosen = chat.check(req, svc.config.model.tool_call_parser)
    template, plain = translate.chat_messages(req)
    tok = svc.tokenizer
    try:
        text = tok.render_chat(template, **chat.template_options(req))
    except TemplateError as exc:
        raise translate.bad_request(str(exc), "messages") from None
    translate.check_text_fits(text, req.truncate_prompt_tokens, svc.max_model_len,
                              tok.max_token_chars, "messages")
    ids = tok.encode(text, bool(req.add_special_tokens))
    ids = translate.truncate(ids, req.truncate_prompt_tokens, req.truncation_side)
    top = (req.top_logprobs or 0) if req.logprobs else None
    requested = req.max_completion_tokens if req.max_completion_tokens is not None \
        else req.max_tokens
    prompt = Prompt(ids, "", plain)
    specs = _specs(svc, req, [prompt], requested, None, top, bool(req.echo),
                   tools.schema(req, chosen))
    return Prepared([prompt], specs, top, chosen, _tool_readers(svc, req, chosen, ids))


def completion_request(svc: Service, req: CompletionRequest) -> Prepared:
    tok = svc.tokenizer
    vocab_size = tok.vocab_size
    add_special = True if req.add_special_tokens is None else req.add_special_tokens
    prompts = []
    for one in translate.completion_prompts(req):
        if isinstance(one, str):
            translate.check_text_fits(one, req.truncate_prompt_tokens, svc.max_model_len,
                                      tok.max_token_chars, "prompt")
            ids, text = tok.encode(one, add_special), one
        else:
            translate.check_vocab(one, vocab_size)
            ids, text = one, tok.decode(one)
        ids = translate.truncate(ids, req.truncate_prompt_tokens, req.truncation_side)
        prompts.append(Prompt(ids, text, [{"role": "user", "content": text}]))
    echo = bool(req.echo)
    requested = 1 if echo and req.max_tokens == 0 else req.max_tokens
    return Prepared(prompts, _specs(svc, req, prompts, requested, 16, req.logprobs, echo),
                    req.logprobs)


def _specs(svc: Service, req: SamplingFields, prompts: list[Prompt], requested: int | None,
           default: int | None, top: int | None, echo: bool, tool_schema: str | None = None
           ) -> list[SamplingSpec]:
    """One spec per prompt: the request's settings, built and checked once (their cost is
    the request's size), with each prompt's output cap (`default`: the endpoint's)."""
    caps = [translate.max_tokens(requested, default, len(p.ids), svc.max_model_len,
                                 svc.config.limits) for p in prompts]
    prompt_lp = req.prompt_logprobs
    if prompt_lp is None and echo and top is not None:
        prompt_lp = top
    first = translate.sampling_spec(req, caps[0], logprobs=top, prompt_logprobs=prompt_lp,
                                    tool_schema=tool_schema)
    translate.check_engine_limits(first, svc.tokenizer.vocab_size)
    try:
        svc.check_sampling(first)
    except ValueError as exc:
        raise translate.bad_request(str(exc), getattr(exc, "param", None)) from None
    return [first if cap == first.max_tokens else msgspec.structs.replace(first, max_tokens=cap)
            for cap in caps]


def _tool_readers(svc: Service, req: ChatCompletionRequest, chosen: str | NamedToolChoice,
                  ids: list[int]) -> list[ToolCallReader] | None:
    """tool_choice "auto" with a tool parser: one parser per choice (they keep state)."""
    parsing = svc.tool_parsing
    if chosen != "auto" or parsing is None:
        return None
    try:
        return list(parsing.readers(msgspec.to_builtins(req), ids, req.n or 1))
    except ValueError as exc:  # vLLM's request model refused what its parser reads
        raise translate.bad_request(f"tool parser: {exc}", "tools") from None
