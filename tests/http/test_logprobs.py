"""The stream's logprob positions in vLLM's shapes (daemon/http/logprobs.py): the engine's
decoded text wins (an empty string is a token's text, not a missing one), candidates per
position as vLLM's server cuts them, text offsets that run on across streamed pieces, -inf
floored, tokens as "token_id:N" on request, prompt logprobs by token id."""

from __future__ import annotations

import math

from daemon.core.stream import TokenLogprob
from daemon.http import logprobs as lp

# A position as vLLM gives it: the sampled token first, then the top candidates by rank.
POS = [TokenLogprob(7, -0.5, 1, " a"), TokenLogprob(8, -1.5, 2, " b"),
       TokenLogprob(9, -2.5, 3, "")]


def _decode(token_id: int) -> str:
    return f"<{token_id}>"


def test_chat_top_candidates_and_bytes() -> None:
    out = lp.chat([7], [POS], lp.Shape(2, False, _decode))
    (one,) = out.content or []
    assert (one.token, one.logprob, one.bytes) == (" a", -0.5, [32, 97])
    assert [(t.token, t.logprob) for t in one.top_logprobs] == [(" a", -0.5), (" b", -1.5)]
    every = lp.chat([7], [POS], lp.Shape(-1, False, _decode)).content or []
    assert [t.token for t in every[0].top_logprobs] == [" a", " b", ""]  # "" kept, not decoded


def test_chat_a_token_without_a_position_is_decoded_and_floored() -> None:
    (one,) = lp.chat([5], [None], lp.Shape(1, False, _decode)).content or []
    assert (one.token, one.logprob, one.top_logprobs) == ("<5>", -9999.0, [])
    undecoded = [TokenLogprob(5, -math.inf, 4, None)]
    (two,) = lp.chat([5], [undecoded], lp.Shape(1, False, _decode)).content or []
    assert (two.token, two.logprob, two.bytes) == ("<5>", -9999.0, None)


def test_completion_keeps_the_sampled_token_beside_the_top_n() -> None:
    out = lp.completion([9], [[POS[2], POS[0], POS[1]]], lp.Shape(1, False, _decode))
    assert out.tokens == [""] and out.token_logprobs == [-2.5]
    assert out.top_logprobs == [{"": -2.5, " a": -0.5}]  # the sampled one and the top 1


def test_completion_text_offsets_run_on_from_where_the_stream_is() -> None:
    shape = lp.Shape(0, False, _decode)
    first = lp.completion([7, 8], [POS, POS[1:]], shape)
    assert first.text_offset == [0, 2]
    later = lp.completion([7], [POS], shape, text_offset=4)
    assert later.text_offset == [4]


def test_tokens_as_token_ids() -> None:
    shape = lp.Shape(1, True, _decode)
    (one,) = lp.chat([7], [POS], shape).content or []
    assert one.token == "token_id:7" and one.top_logprobs[0].token == "token_id:7"
    assert lp.completion([5], [None], shape).tokens == ["token_id:5"]


def test_prompt_logprobs_by_token_id() -> None:
    assert lp.prompt(None) is None
    out = lp.prompt([None, [TokenLogprob(3, -math.inf, 9, "x")]])
    assert out is not None and out[0] is None
    assert {k: (v.logprob, v.rank, v.decoded_token) for k, v in (out[1] or {}).items()} == {
        "3": (-9999.0, 9, "x")}
