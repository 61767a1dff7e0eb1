"""OpenAI request bodies -> the job's prompt ids and sampling spec, with the 400s for bad input."""

from __future__ import annotations

from typing import Any

import msgspec

from daemon.config import LimitsConfig
from daemon.core.job import SamplingSpec
from daemon.http.errors import ApiError, bad_request
from daemon.http.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields

_ROLES = frozenset({"system", "user", "assistant", "developer", "tool"})
_MAX_STOP_STRINGS = 4  # as OpenAI


def decode_body(body: bytes, kind: type[msgspec.Struct]) -> Any:
    if not body:
        raise bad_request("request body is empty; expected a JSON object")
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise bad_request(f"invalid request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise bad_request(f"malformed JSON: {exc}") from None


def chat_messages(req: ChatCompletionRequest) -> list[dict[str, str]]:
    if not req.messages:
        raise bad_request("'messages' must contain at least one message", "messages")
    out = []
    for i, msg in enumerate(req.messages):
        if msg.role not in _ROLES:
            raise bad_request(f"messages[{i}].role {msg.role!r} is not one of {sorted(_ROLES)}",
                              f"messages[{i}].role")
        if isinstance(msg.content, list):
            if any(part.type != "text" for part in msg.content):
                raise bad_request(f"messages[{i}].content: only text parts are supported",
                                  f"messages[{i}].content")
            text = "".join(part.text or "" for part in msg.content)
        else:
            text = msg.content or ""
        out.append({"role": "system" if msg.role == "developer" else msg.role, "content": text})
    return out


def completion_prompt(req: CompletionRequest) -> str | list[int]:
    """A single prompt: text or token ids. Batches are refused like n > 1."""
    prompt = req.prompt
    if isinstance(prompt, str):
        return prompt
    if len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
        if isinstance(prompt, str):
            return prompt
    if prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    raise bad_request("'prompt' must be a string or a list of token ids (one prompt per request)",
                      "prompt")


def check_vocab(token_ids: list[int], vocab_size: int) -> None:
    if any(not 0 <= t < vocab_size for t in token_ids):
        raise bad_request(f"prompt token ids must be in 0..{vocab_size - 1}", "prompt")


def sampling_spec(req: SamplingFields, requested_max: int | None, prompt_tokens: int,
                  max_model_len: int, limits: LimitsConfig) -> SamplingSpec:
    _check_ranges(req)
    room = max_model_len - prompt_tokens
    if prompt_tokens == 0:
        raise bad_request("the prompt is empty", "prompt")
    if room < 1:
        raise bad_request(f"the prompt has {prompt_tokens} tokens; this model's context is "
                          f"{max_model_len} tokens", "messages", "context_length_exceeded")
    if requested_max is None:
        max_tokens = min(room, limits.default_max_tokens) if limits.default_max_tokens else room
    elif requested_max <= 0:
        raise bad_request("'max_tokens' must be at least 1", "max_tokens")
    elif requested_max > room:
        raise bad_request(f"'max_tokens' is {requested_max} but the prompt has {prompt_tokens} "
                          f"tokens and the context is {max_model_len}: at most {room} fit",
                          "max_tokens", "context_length_exceeded")
    else:
        max_tokens = requested_max
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    return SamplingSpec(
        max_tokens=max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        stop=stop, seed=req.seed, ignore_eos=req.ignore_eos, min_tokens=req.min_tokens,
        presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
    )


def _check_ranges(req: SamplingFields) -> None:
    if req.n != 1:
        raise bad_request("only n=1 is supported", "n")
    checks: list[tuple[bool, str, str]] = [
        (req.temperature is not None and not 0 <= req.temperature <= 2,
         "'temperature' must be in [0, 2]", "temperature"),
        (req.top_p is not None and not 0 < req.top_p <= 1, "'top_p' must be in (0, 1]", "top_p"),
        (not -2 <= req.presence_penalty <= 2, "'presence_penalty' must be in [-2, 2]",
         "presence_penalty"),
        (not -2 <= req.frequency_penalty <= 2, "'frequency_penalty' must be in [-2, 2]",
         "frequency_penalty"),
        (req.min_tokens < 0, "'min_tokens' must be >= 0", "min_tokens"),
        (isinstance(req.stop, list) and len(req.stop) > _MAX_STOP_STRINGS,
         f"at most {_MAX_STOP_STRINGS} stop sequences", "stop"),
    ]
    for failed, message, param in checks:
        if failed:
            raise bad_request(message, param)


def unknown_model(name: str, served: str) -> ApiError:
    return bad_request(f"model {name!r} does not exist; this server serves {served!r}", "model",
                       "model_not_found")
