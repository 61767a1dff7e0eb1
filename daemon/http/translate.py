"""OpenAI request bodies -> the jobs' prompts and sampling spec, with the 400s for bad input.

vLLM's meaning field by field: its defaults where a field is left out, its checks where no
type can say them (in its words); what the engine itself would refuse (ids outside the
vocabulary, too many logprobs, a grammar that does not compile) is asked of the engine
before a job exists (Service.check_sampling)."""

from __future__ import annotations

import gc
import re
from typing import Any

import msgspec

from daemon.config import LimitsConfig
from daemon.core.job import SamplingSpec, StructuredSpec
from daemon.http.errors import ApiError, bad_request
from daemon.http.schemas import (
    REFUSED,
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
    TokenizeRequest,
)

_UNKNOWN_FIELD = re.compile(r"unknown field `([^`]*)`")
_AT_PATH = re.compile(r" - at `([^`]*)`$")
_MISSING = re.compile(r"missing required field `([^`]*)`")


def decode_body(body: bytes, kind: type[msgspec.Struct]) -> Any:
    if not body:
        raise bad_request("request body is empty; expected a JSON object")
    try:
        req = _decode(body, kind)
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


def _decode(body: bytes, kind: type[msgspec.Struct]) -> Any:
    """The body decoded with the garbage collector off: a body of many small arrays or
    objects is as many allocations, and the collections they set off cost several times the
    decoding itself, on the event loop (measured: 800k one-element lists, 1.5 s -> 0.4 s);
    nothing it allocates can be garbage before it returns."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return msgspec.json.decode(body, type=kind)
    finally:
        if enabled:
            gc.enable()


def _invalid(message: str) -> ApiError:
    """A schema error, with the field it names as `param` ($.messages[0].role, unknown x)."""
    if unknown := _UNKNOWN_FIELD.search(message):
        name = unknown.group(1)
        return bad_request(f"unknown field {name!r}: lengthwise does not accept it", name)
    where = _AT_PATH.search(message)
    param = where.group(1).removeprefix("$").removeprefix(".") if where else None
    if param is not None:  # a mapping's value: msgspec does not name the key
        param = param.split("[...]", 1)[0]
    if missing := _MISSING.search(message):  # the field itself, not its parent
        param = f"{param}.{missing.group(1)}" if param else missing.group(1)
    return bad_request(f"invalid request: {message}", param or None)


def _check_supported(req: Any) -> None:
    for name, why in REFUSED.items():
        value = getattr(req, name, None)
        if not _neutral(name, value):
            raise bad_request(f"{name!r}: {why}", name, "unsupported_parameter")


def _neutral(name: str, value: Any) -> bool:
    """A value that asks for nothing: the same answer as leaving the field out."""
    if value is None or value is False or value == "" or value == [] or value == {}:
        return True
    return name == "best_of" and value == 1 and value is not True


def chat_messages(req: ChatCompletionRequest | TokenizeRequest
                  ) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """(the messages as the chat template takes them, the text the predictor reads)."""
    if not req.messages:
        raise bad_request("'messages' must contain at least one message", "messages")
    template, plain = [], []
    for i, msg in enumerate(req.messages):
        if isinstance(msg.content, list):
            if any(part.type != "text" for part in msg.content):
                raise bad_request(f"messages[{i}].content: only text parts are supported "
                                  "(the model is text-only)", f"messages[{i}].content")
            # vLLM joins text parts line by line for templates that take a string
            text = "\n".join(part.text or "" for part in msg.content)
        else:
            text = msg.content or ""
        role = "system" if msg.role == "developer" else msg.role
        entry: dict[str, Any] = {"role": role, "content": text}
        if msg.name is not None:
            entry["name"] = msg.name
        if msg.tool_calls:
            entry["tool_calls"] = [
                {"id": call.id, "type": call.type,
                 "function": {"name": call.function.name,
                              "arguments": _arguments(call.function.arguments)}}
                for call in msg.tool_calls]
        if msg.tool_call_id is not None:
            entry["tool_call_id"] = msg.tool_call_id
        if (reasoning := msg.reasoning or msg.reasoning_content) is not None:
            entry["reasoning"] = reasoning
        template.append(entry)
        plain.append({"role": role, "content": text})
    return template, plain


def _arguments(text: str) -> Any:
    """Tool call arguments as the templates expect them (a mapping), like vLLM."""
    try:
        return msgspec.json.decode(text) if text else {}
    except msgspec.DecodeError:
        return text


def completion_prompts(req: CompletionRequest) -> list[str | list[int]]:
    """The request's prompts: one text or token-id list, or a batch of either."""
    prompt = req.prompt
    if prompt is None or prompt == "" or prompt == []:
        raise bad_request("Either prompt or prompt_embeds must be provided and non-empty.",
                          "prompt")
    if isinstance(prompt, str):
        return [prompt]
    if all(isinstance(t, int) for t in prompt):
        return [[t for t in prompt if isinstance(t, int)]]
    out: list[str | list[int]] = []
    for one in prompt:
        if isinstance(one, int):
            raise bad_request("'prompt' mixes token ids with texts or lists", "prompt")
        if isinstance(one, list) and not one:
            raise bad_request("a prompt in the batch is empty", "prompt")
        out.append(one)
    return out


def truncate(ids: list[int], keep: int | None, side: str | None) -> list[int]:
    """truncate_prompt_tokens (vLLM): keep that many prompt tokens (-1: the model's limit,
    which the context check applies anyway), from the left by default."""
    if keep is None or keep < 0 or keep >= len(ids):
        return ids
    return ids[:keep] if side == "right" else ids[len(ids) - keep:]


def check_text_fits(text: str, truncate_to: int | None, max_model_len: int,
                    max_token_chars: int, param: str) -> None:
    """A prompt text that cannot fit the context whatever its tokens are (at least
    len / max_token_chars of them) is refused before it is tokenized: tokenizing costs about
    2 us a character, and the body may hold millions. One that is to be truncated
    (truncate_prompt_tokens) is tokenized whole, as in vLLM."""
    fewest = -(-len(text) // max_token_chars)
    if truncate_to is None and fewest >= max_model_len:
        raise bad_request(f"This model's maximum context length is {max_model_len} tokens; "
                          f"the prompt has at least {fewest} ({len(text)} characters)", param,
                          "context_length_exceeded")


def check_vocab(token_ids: list[int], vocab_size: int, param: str = "prompt") -> None:
    if any(not 0 <= t < vocab_size for t in token_ids):
        raise bad_request(f"token ids must be in 0..{vocab_size - 1}", param)


def check_priority(priority: int, limits: LimitsConfig) -> None:
    if not limits.priority_min <= priority <= limits.priority_max:
        raise bad_request(f"'priority' must be in [{limits.priority_min}, "
                          f"{limits.priority_max}] (limits.priority_range)", "priority")


def max_tokens(requested: int | None, default: int | None, prompt_tokens: int,
               max_model_len: int, limits: LimitsConfig) -> int:
    """The output cap: what the request asks (`default` when it names none, as vLLM's
    endpoint does; None: the rest of the context, or limits.default_max_tokens)."""
    room = max_model_len - prompt_tokens
    if prompt_tokens == 0:
        raise bad_request("the prompt is empty", "prompt")
    if room < 1:
        raise bad_request(f"This model's maximum context length is {max_model_len} tokens; "
                          f"the prompt has {prompt_tokens}", "messages",
                          "context_length_exceeded")
    if requested is None:
        requested = default
    if requested is None:
        return min(room, limits.default_max_tokens) if limits.default_max_tokens else room
    if requested <= 0:
        raise bad_request(f"max_tokens must be at least 1, got {requested}.", "max_tokens")
    if requested > room:
        raise bad_request(f"'max_tokens' is {requested} but the prompt has {prompt_tokens} "
                          f"tokens and the context is {max_model_len}: at most {room} fit",
                          "max_tokens", "context_length_exceeded")
    return requested


def structured(req: SamplingFields, tool_schema: str | None = None) -> StructuredSpec | None:
    """vLLM's structured outputs: `structured_outputs`, overridden by `response_format`
    (as vLLM), or the JSON schema a tool choice needs."""
    so = req.structured_outputs
    fields: dict[str, Any] = {} if so is None else {
        "json": so.json if isinstance(so.json, str) or so.json is None
        else msgspec.json.encode(so.json).decode(),
        "regex": so.regex, "choice": tuple(so.choice) if so.choice is not None else None,
        "grammar": so.grammar, "json_object": so.json_object,
        "structural_tag": so.structural_tag,
        "disable_any_whitespace": so.disable_any_whitespace,
        "disable_additional_properties": so.disable_additional_properties,
        "whitespace_pattern": so.whitespace_pattern}
    if so is not None and sum(fields[k] is not None for k in ("json", "regex", "choice")) > 1:
        raise bad_request("You can only use one kind of constraints for structured outputs "
                          "('json', 'regex' or 'choice').", "structured_outputs")
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_object":
        fields["json_object"] = True
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise bad_request("When response_format type is 'json_schema', the "
                              "'json_schema' field must be provided.", "response_format")
        fields["json"] = msgspec.json.encode(fmt.json_schema.schema or {}).decode()
    elif fmt is not None and fmt.type == "structural_tag":
        body = msgspec.structs.asdict(fmt)
        fields["structural_tag"] = msgspec.json.encode(
            {k: v for k, v in body.items() if v is not None}).decode()
    if tool_schema is not None:
        fields["json"] = tool_schema
    if not any(v not in (None, False) for v in fields.values()):
        return None
    return StructuredSpec(**fields)


def sampling_spec(req: SamplingFields, max_new: int, *, logprobs: int | None,
                  prompt_logprobs: int | None, tool_schema: str | None = None
                  ) -> SamplingSpec:
    """The job's sampling settings: the request's, with vLLM's defaults."""
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    bias: list[tuple[int, float]] = []
    for key, value in (req.logit_bias or {}).items():
        try:
            bias.append((int(key), min(max(value, -100.0), 100.0)))  # clamped, as vLLM
        except ValueError:
            raise bad_request(f"logit_bias: token id {key!r} is not an integer",
                              "logit_bias") from None
    extra: dict[str, object] = dict(req.vllm_xargs or {})
    if req.kv_transfer_params:
        extra["kv_transfer_params"] = req.kv_transfer_params
    detection = req.repetition_detection
    budget = req.thinking_token_budget
    return SamplingSpec(
        max_tokens=max_new,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=req.top_k or 0, min_p=req.min_p or 0.0,
        stop=stop, stop_token_ids=tuple(dict.fromkeys(req.stop_token_ids or ())),
        include_stop_str_in_output=req.include_stop_str_in_output,
        seed=None if req.seed == -1 else req.seed,
        ignore_eos=req.ignore_eos, min_tokens=req.min_tokens,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        logprobs=None if req.logprob_token_ids else logprobs,
        logprob_token_ids=tuple(req.logprob_token_ids) if req.logprob_token_ids else None,
        prompt_logprobs=prompt_logprobs,
        logit_bias=tuple(bias),
        allowed_token_ids=(tuple(req.allowed_token_ids)
                           if req.allowed_token_ids is not None else None),
        bad_words=tuple(dict.fromkeys(req.bad_words or ())),
        structured=structured(req, tool_schema),
        skip_special_tokens=req.skip_special_tokens,
        spaces_between_special_tokens=req.spaces_between_special_tokens,
        thinking_token_budget=None if budget is None or budget == -1 else budget,
        repetition_detection=(msgspec.structs.asdict(detection)
                              if detection is not None else None),
        watermarking=req.watermarking, cache_salt=req.cache_salt,
        extra_args=extra or None,
    )


MAX_LOGPROBS = 20  # vLLM's default --max-logprobs


def check_engine_limits(spec: SamplingSpec, vocab_size: int) -> None:
    """What vLLM's engine refuses whatever engine runs the job: token ids outside the
    vocabulary, more logprobs than its default max_logprobs (in vLLM's words)."""
    for name, ids in (("stop_token_ids", spec.stop_token_ids),
                      ("allowed_token_ids", spec.allowed_token_ids or ()),
                      ("logit_bias", [t for t, _ in spec.logit_bias]),
                      ("logprob_token_ids", spec.logprob_token_ids or ())):
        if bad := [t for t in ids if not 0 <= t < vocab_size]:
            raise bad_request(f"token_id(s) {bad} in {name} contain out-of-vocab token ids. "
                              f"Vocabulary size: {vocab_size}", name)
    if spec.allowed_token_ids is not None and not spec.allowed_token_ids:
        raise bad_request("allowed_token_ids is not None and empty!", "allowed_token_ids")
    for name, num in (("logprobs", spec.logprobs), ("prompt_logprobs", spec.prompt_logprobs)):
        wanted = vocab_size if num == -1 else num
        if wanted is not None and wanted > MAX_LOGPROBS:
            raise bad_request(f"Requested {name.replace('_', ' ')} of {wanted}, which is "
                              f"greater than max allowed: {MAX_LOGPROBS}", name)


def check_request(req: SamplingFields, stream: bool) -> None:
    """vLLM's request-level checks that no field's type can say."""
    if req.stream_options is not None and not stream:
        raise bad_request("Stream options can only be defined when `stream=True`.",
                          "stream_options")
    if req.prompt_logprobs is not None and stream and req.prompt_logprobs != 0:
        raise bad_request("`prompt_logprobs` are not available when `stream=True`.",
                          "prompt_logprobs")
    if (req.n or 1) > 1 and req.temperature is not None and req.temperature < 1e-5:
        raise bad_request(f"n must be 1 when using greedy sampling, got {req.n}.", "n")
    if req.min_tokens and req.max_tokens and req.min_tokens > req.max_tokens:
        raise bad_request(f"min_tokens must be less than or equal to max_tokens="
                          f"{req.max_tokens}, got {req.min_tokens}.", "min_tokens")


def unknown_model(name: str, served: str) -> ApiError:
    shown = name if len(name) <= 128 else name[:128] + "..."  # a client's string, echoed
    return bad_request(f"model {shown!r} does not exist; this server serves {served!r}",
                       "model", "model_not_found")
