"""OpenAI request bodies -> the job's prompt ids and sampling spec, with the 400s for bad input."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from daemon.config import LimitsConfig
from daemon.core.job import SamplingSpec
from daemon.http.errors import ApiError, bad_request
from daemon.http.schemas import (
    UNSUPPORTED,
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
)

_UNKNOWN_FIELD = re.compile(r"unknown field `([^`]*)`")
_AT_PATH = re.compile(r" - at `([^`]*)`$")


def decode_body(body: bytes, kind: type[msgspec.Struct]) -> Any:
    if not body:
        raise bad_request("request body is empty; expected a JSON object")
    try:
        req = msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise _invalid(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise bad_request(f"malformed JSON: {exc}") from None
    except RecursionError:
        raise bad_request("JSON nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise bad_request(f"request body is not valid UTF-8 (byte {exc.start})") from None
    _check_supported(req)
    return req


def _invalid(message: str) -> ApiError:
    """A schema error, with the field it names as `param` ($.messages[0].role, unknown x)."""
    if unknown := _UNKNOWN_FIELD.search(message):
        name = unknown.group(1)
        return bad_request(f"unknown field {name!r}: lengthwise does not accept it", name)
    where = _AT_PATH.search(message)
    param = where.group(1).removeprefix("$").removeprefix(".") if where else None
    return bad_request(f"invalid request: {message}", param or None)


def _check_supported(req: Any) -> None:
    for name in UNSUPPORTED:
        value = getattr(req, name, None)
        if not _neutral(name, value):
            raise bad_request(f"{name!r} is not supported by lengthwise; leave it out", name,
                              "unsupported_parameter")


def _neutral(name: str, value: Any) -> bool:
    """A value that asks for nothing: the same answer as leaving the field out."""
    if value is None or value is False or value == "" or value == [] or value == {}:
        return True
    return (name == "best_of" and value == 1 and value is not True) or \
        (name == "response_format" and value == {"type": "text"}) or \
        (name == "tool_choice" and value in ("none", "auto"))


def chat_messages(req: ChatCompletionRequest) -> list[dict[str, str]]:
    if not req.messages:
        raise bad_request("'messages' must contain at least one message", "messages")
    out = []
    for i, msg in enumerate(req.messages):
        if msg.tool_calls or msg.function_call:
            raise bad_request("tool calls are not supported by lengthwise",
                              f"messages[{i}].tool_calls", "unsupported_parameter")
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
    if not limits.priority_min <= req.priority <= limits.priority_max:
        raise bad_request(f"'priority' must be in [{limits.priority_min}, "
                          f"{limits.priority_max}]", "priority")
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
    # Value ranges are checked while decoding (schemas.py); this is what a schema cannot say.
    if req.n != 1:
        raise bad_request("only n=1 is supported", "n")


def unknown_model(name: str, served: str) -> ApiError:
    return bad_request(f"model {name!r} does not exist; this server serves {served!r}", "model",
                       "model_not_found")
