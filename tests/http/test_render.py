"""Response pieces as vLLM's server writes them (daemon/http/render.py): completions with
echo, streamed logprob offsets that run on across chunks, token ids, usage counting a
shared prompt once; a text-only chat chunk framed around its text (TextFrame)."""

from __future__ import annotations

import pytest

from daemon.core.stream import JobEnd, OutputStream, TokenDelta, TokenLogprob
from daemon.http import logprobs as lp
from daemon.http import render
from daemon.http.responses import ChatChunkChoice, ChatCompletionChunk, Delta, Usage

PROMPT = [11, 12]


def _choice(index: int = 0, prompt: list[int] = PROMPT) -> render.Choice:
    return render.Choice(index, f"job-{index}", OutputStream(), prompt, "Hi there")


def _pos(token_id: int, text: str) -> list[TokenLogprob]:
    return [TokenLogprob(token_id, -1.0, 1, text)]


def _opts(**fields: object) -> render.Options:
    shape = lp.Shape(0, False, str)
    return render.Options("m", shape, **fields)  # type: ignore[arg-type]


def test_streamed_text_offsets_run_on_across_pieces() -> None:
    c, opts = _choice(), _opts()
    offsets = []
    for token_id, text in ((1, " one"), (2, " two"), (3, "!")):
        delta = TokenDelta(text, [token_id], [_pos(token_id, text)])
        c.take(delta)
        piece = render.completion_piece(c, opts, delta, token_id == 1, None)
        assert piece.logprobs is not None
        offsets += piece.logprobs.text_offset
    assert offsets == [0, 4, 8]
    whole = render.completion_piece(c, opts, None, True, JobEnd("length"))
    assert whole.logprobs is not None and whole.logprobs.text_offset == [0, 4, 8]
    assert whole.text == " one two!" and whole.finish_reason == "length"


def test_echo_puts_the_prompt_first_and_no_text_with_token_ids() -> None:
    c = _choice()
    c.stream.prompt_logprobs = [None, _pos(12, " there")]
    c.take(TokenDelta(" you", [5], [_pos(5, " you")]))
    piece = render.completion_piece(c, _opts(echo=True), None, True, JobEnd("length"))
    assert piece.text == "Hi there you"
    assert piece.logprobs is not None and piece.logprobs.token_logprobs == [None, -1.0, -1.0]
    # vLLM's own rule: with the prompt's ids returned, the echoed text is left out
    quiet = render.completion_piece(c, _opts(echo=True, return_token_ids=True), None, True,
                                    JobEnd("length"))
    assert quiet.text == " you" and quiet.prompt_token_ids == PROMPT
    assert quiet.token_ids == [5]


def test_usage_counts_a_shared_prompt_once() -> None:
    shared = [_choice(0), _choice(1)]  # n = 2 of one prompt
    for c in shared:
        c.stream.num_tokens = 3
    assert render.usage(shared, render.prompt_tokens(shared)) == Usage(2, 6, 8)
    batch = [_choice(0, [1, 2, 3]), _choice(1, [4])]  # two prompts
    assert render.prompt_tokens(batch) == 4


def _text_chunk(text: str) -> ChatCompletionChunk:
    return ChatCompletionChunk("chatcmpl-1", 1732550000, "tiny",
                               [ChatChunkChoice(0, Delta(content=text))])


@pytest.mark.parametrize("text", [" hello", "", "\"quoted\" \\ back", "line\nbreak",
                                  "\x00text", "naïve – 東京 🙂"])
def test_a_framed_text_is_the_encoded_chunk(text: str) -> None:
    assert render.TextFrame(_text_chunk)(text) == render.sse(_text_chunk(text))
