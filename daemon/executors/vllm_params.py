"""A job's SamplingSpec as vLLM's SamplingParams for one dispatch, vLLM's own checks of a
request's settings before a job exists, and vLLM's logprobs as the stream's positions (part
of the vLLM executor: only vllm.py uses it).

Per dispatch: max_tokens is what the dispatch may run; min_tokens what is still owed;
penalties of a resumed job move into the carried-penalties processor (vllm_penalties.py);
prompt logprobs are asked for only until the job's stream has them (a resume's prompt holds
earlier output, whose logprobs went out already). Stop strings stay with the job's stream
(daemon/core/stream.py); stop token ids, logit bias, allowed ids, top-k, min-p and the
repetition penalty (over prompt and output alike) mean the same after a resume.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vllm import SamplingParams
from vllm.sampling_params import (
    RepetitionDetectionParams,
    RequestOutputKind,
    StructuredOutputsParams,
)

from daemon.core.events import Launch
from daemon.core.job import SamplingSpec, StructuredSpec
from daemon.core.stream import Position, TokenLogprob
from daemon.executors import vllm_penalties


class SamplingRefused(ValueError):
    """vLLM refuses these settings; `param` names the request field when vLLM says."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


def _structured(spec: StructuredSpec | None) -> StructuredOutputsParams | None:
    if spec is None:
        return None
    return StructuredOutputsParams(
        json=spec.json, regex=spec.regex,
        choice=list(spec.choice) if spec.choice is not None else None,
        grammar=spec.grammar, json_object=spec.json_object,
        structural_tag=spec.structural_tag, disable_any_whitespace=spec.disable_any_whitespace,
        disable_additional_properties=spec.disable_additional_properties,
        whitespace_pattern=spec.whitespace_pattern)


def sampling_params(spec: SamplingSpec, max_new_tokens: int, generated: list[int],
                    prompt_logprobs: bool, extra: dict[str, Any] | None = None
                    ) -> SamplingParams:
    """The dispatch's SamplingParams: `generated` is the output before it (a resume),
    `prompt_logprobs` whether to ask for them now, `extra` more extra_args (kvstore)."""
    # vLLM penalizes output tokens only: a resumed job's earlier tokens are prompt now,
    # so its penalties move into the logits processor, which counts them too.
    carried = generated if spec.presence_penalty or spec.frequency_penalty else []
    extra_args: dict[str, Any] = dict(spec.extra_args or {})
    if carried:
        extra_args.update(vllm_penalties.extra_args(spec.presence_penalty,
                                                    spec.frequency_penalty, list(carried)))
    extra_args.update(extra or {})
    detection = (RepetitionDetectionParams(**spec.repetition_detection)
                 if spec.repetition_detection is not None else None)
    return SamplingParams(
        max_tokens=max_new_tokens,
        temperature=spec.temperature, top_p=spec.top_p, top_k=spec.top_k, min_p=spec.min_p,
        # Stop strings are the job's (across resumes): daemon/core/stream.py.
        stop_token_ids=list(spec.stop_token_ids),
        seed=spec.seed, ignore_eos=spec.ignore_eos,
        # min_tokens counts from this dispatch; only what is still owed applies.
        min_tokens=max(min(spec.min_tokens - len(generated), max_new_tokens), 0),
        presence_penalty=0.0 if carried else spec.presence_penalty,
        frequency_penalty=0.0 if carried else spec.frequency_penalty,
        repetition_penalty=spec.repetition_penalty,
        logprobs=spec.logprobs,
        logprob_token_ids=list(spec.logprob_token_ids) if spec.logprob_token_ids else None,
        prompt_logprobs=spec.prompt_logprobs if prompt_logprobs else None,
        logit_bias=dict(spec.logit_bias) or None,
        allowed_token_ids=(list(spec.allowed_token_ids)
                           if spec.allowed_token_ids is not None else None),
        bad_words=list(spec.bad_words) or None,
        structured_outputs=_structured(spec.structured),
        skip_special_tokens=spec.skip_special_tokens,
        spaces_between_special_tokens=spec.spaces_between_special_tokens,
        thinking_token_budget=spec.thinking_token_budget,
        repetition_detection=detection,
        watermarking=spec.watermarking,
        extra_args=extra_args or None,
        output_kind=RequestOutputKind.DELTA,
    )


def for_launch(launch: Launch, prompt_logprobs: bool,
               kv_transfer_params: dict[str, str] | None = None) -> SamplingParams:
    extra = {"kv_transfer_params": kv_transfer_params} if kv_transfer_params else None
    return sampling_params(launch.sampling, launch.max_new_tokens,
                           launch.generated_token_ids, prompt_logprobs, extra)


def check(spec: SamplingSpec, engine: Any) -> None:
    """What vLLM itself refuses about `spec` on this engine (ranges, ids outside the
    vocabulary, more logprobs than max_logprobs, a grammar it cannot compile): raises
    SamplingRefused with vLLM's message."""
    from vllm.exceptions import VLLMValidationError

    try:
        params = sampling_params(spec, spec.max_tokens, [], True)
        config = engine.vllm_config
        tokenizer = engine.tokenizer
        params.verify(config.model_config, config.speculative_config,
                      config.structured_outputs_config, tokenizer)
        if tokenizer is not None:
            params.update_from_tokenizer(tokenizer)  # bad words that do not tokenize
            _check_bad_words_tokens(params)
    except VLLMValidationError as exc:
        raise SamplingRefused(str(exc), getattr(exc, "parameter", None)) from None
    except (ValueError, TypeError) as exc:
        raise SamplingRefused(str(exc), None) from None


def _check_bad_words_tokens(params: SamplingParams) -> None:
    """vLLM's model runner refuses more bad-word tokens than VLLM_MAX_BAD_WORDS_TOTAL_TOKENS
    (its buffer's width) when the request reaches it; refused here, in its words, before."""
    from vllm import envs
    from vllm.exceptions import VLLMValidationError

    total = sum(len(ids) for ids in params.bad_words_token_ids or ())
    if total > envs.VLLM_MAX_BAD_WORDS_TOTAL_TOKENS:
        raise VLLMValidationError(f"Too many total bad word tokens: {total}. The max is "
                                  f"{envs.VLLM_MAX_BAD_WORDS_TOTAL_TOKENS}.",
                                  parameter="bad_words")


def positions(logprobs: Iterable[dict[int, Any] | None] | None) -> list[Position | None]:
    """vLLM's logprobs (list of {token id: Logprob} or FlatLogprobs) as stream positions."""
    if logprobs is None:
        return []
    return [None if one is None else
            [TokenLogprob(int(token_id), float(lp.logprob), lp.rank, lp.decoded_token)
             for token_id, lp in one.items()]
            for one in logprobs]
