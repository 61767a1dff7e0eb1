"""A job's sampling as vLLM's SamplingParams per dispatch (daemon/executors/vllm_params.py):
every field carried with vLLM's meaning; on a resume, what is still owed (min_tokens), the
penalties moved into the carried-penalties processor with the tokens generated before,
prompt logprobs asked for only until they went out; vLLM's Logprob as stream positions,
its decoded text kept as given (None where it decoded none)."""

from __future__ import annotations

import pytest
from vllm.logprobs import Logprob
from vllm.sampling_params import RequestOutputKind

from daemon.core.job import SamplingSpec, StructuredSpec
from daemon.core.stream import TokenLogprob
from daemon.executors import vllm_params, vllm_penalties

SPEC = SamplingSpec(max_tokens=50, temperature=0.7, top_k=5, min_p=0.05, min_tokens=10,
                    stop=("END",), stop_token_ids=(13,), repetition_penalty=1.3,
                    presence_penalty=0.5, frequency_penalty=0.25, logprobs=2,
                    prompt_logprobs=1, logit_bias=((7, -5.0),), allowed_token_ids=None,
                    bad_words=("darn",), structured=StructuredSpec(regex="[a-z]+"),
                    seed=3, ignore_eos=True)


def test_a_first_dispatch_carries_every_field() -> None:
    params = vllm_params.sampling_params(SPEC, 50, [], True)
    assert (params.max_tokens, params.temperature, params.top_k, params.min_p) == \
        (50, 0.7, 5, 0.05)
    assert params.stop_token_ids == [13] and params.stop == []  # stop strings: the stream's
    assert (params.repetition_penalty, params.presence_penalty, params.frequency_penalty) \
        == (1.3, 0.5, 0.25)
    assert (params.logprobs, params.prompt_logprobs, params.min_tokens) == (2, 1, 10)
    assert params.logit_bias == {7: -5.0} and params.bad_words == ["darn"]
    assert params.structured_outputs is not None
    assert params.structured_outputs.regex == "[a-z]+"
    assert (params.seed, params.ignore_eos) == (3, True)
    assert params.output_kind == RequestOutputKind.DELTA
    assert params.extra_args is None


def test_a_resume_owes_the_rest_and_carries_the_penalties() -> None:
    generated = [4, 4, 9]
    params = vllm_params.sampling_params(SPEC, 20, generated, False, {"k": "v"})
    assert params.max_tokens == 20 and params.min_tokens == 7  # 10 - 3 already out
    assert params.prompt_logprobs is None  # they went out with the first dispatch
    # vLLM penalizes output tokens only; the processor counts the earlier ones too
    assert (params.presence_penalty, params.frequency_penalty) == (0.0, 0.0)
    assert params.extra_args == {**vllm_penalties.extra_args(0.5, 0.25, generated),
                                 "k": "v"}
    assert params.repetition_penalty == 1.3  # vLLM's counts prompt tokens: unchanged
    done = vllm_params.sampling_params(SPEC, 5, list(range(12)), False)
    assert done.min_tokens == 0


def test_positions_from_vllms_logprobs() -> None:
    step = {5: Logprob(-0.25, rank=1, decoded_token=" a"),
            6: Logprob(-1.5, rank=2, decoded_token=""),
            7: Logprob(-3.0, rank=3, decoded_token=None)}
    assert vllm_params.positions(None) == []
    assert vllm_params.positions([None, step]) == [None, [
        TokenLogprob(5, -0.25, 1, " a"), TokenLogprob(6, -1.5, 2, ""),
        TokenLogprob(7, -3.0, 3, None)]]


def test_bad_words_beyond_vllms_token_budget_are_refused_before_the_engine() -> None:
    from vllm import envs
    from vllm.exceptions import VLLMValidationError

    budget = envs.VLLM_MAX_BAD_WORDS_TOTAL_TOKENS
    params = vllm_params.sampling_params(SamplingSpec(max_tokens=4, bad_words=("x",)), 4, [],
                                         False)
    params._bad_words_token_ids = [[1] * budget]  # as update_from_tokenizer leaves them
    vllm_params._check_bad_words_tokens(params)  # at the budget: fine
    params._bad_words_token_ids = [[1] * budget, [2]]
    with pytest.raises(VLLMValidationError, match=f"Too many total bad word tokens: "
                                                  f"{budget + 1}. The max is {budget}."):
        vllm_params._check_bad_words_tokens(params)
