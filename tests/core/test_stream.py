"""A job's output stream: stop strings over the text of all dispatches (held-back tails,
straddling matches, min_tokens, the first-completing match), merging what the reader has not
taken, flushing what it held back at the end, and the first prediction for the headers."""

from __future__ import annotations

import asyncio

import pytest

from daemon.core.stream import JobEnd, OutputStream, StopScan, TokenDelta, scan


def test_no_stop_strings_release_everything() -> None:
    assert scan("", "abc", (), True) == StopScan("abc", "", False)


def test_a_possible_stop_prefix_is_held_back() -> None:
    assert scan("", "hello wor", ("world!",), True) == StopScan("hell", "o wor", False)


def test_a_match_straddling_held_and_new_text_stops() -> None:
    assert scan("o wor", "ld! more", ("world!",), True) == StopScan("o ", "", True, "world!")


def test_the_match_that_completes_first_wins_then_list_order() -> None:
    assert scan("", "xabcdy", ("abcd", "bc"), True) == StopScan("xa", "", True, "bc")
    assert scan("", "xabcy", ("bc", "abc"), True) == StopScan("xa", "", True, "bc")
    assert scan("", "xbcy", ("bc", "b"), True).release == "x"


def test_before_min_tokens_nothing_matches_and_old_text_is_not_rescanned() -> None:
    early = scan("", "a STOP b", ("STOP",), False)
    assert not early.stopped
    # Once checking starts, only matches that end in the new text count (as in vLLM).
    later = scan(early.held, "c", ("STOP",), True)
    assert not later.stopped and early.release + later.release + later.held == "a STOP bc"


@pytest.mark.asyncio
@pytest.mark.parametrize("cut", range(1, 12))
async def test_pushes_over_any_cut_give_the_uncut_result(cut: int) -> None:
    """Two deltas split anywhere give what one delta gives: the text before the stop."""
    text = "one two three four"
    stream = OutputStream(stops=("three",))
    stopped = [stream.push(text[:cut], [1]), stream.push(text[cut:], [2])]
    assert stopped == [False, True]
    assert stream.push("more", [3])  # after the stop nothing more is taken
    stream.finish("stop")
    assert await stream.next() == TokenDelta("one two ", [1, 2])
    assert await stream.next() == JobEnd("stop", stop_reason="three")
    assert stream.num_tokens == 2


@pytest.mark.asyncio
async def test_held_text_is_flushed_when_the_job_ends_without_a_stop() -> None:
    stream = OutputStream(stops=("xyz",))
    assert not stream.push("abcx", [1])
    assert await stream.next() == TokenDelta("ab", [1])
    stream.finish("length")
    assert await stream.next() == TokenDelta("cx", [])
    assert await stream.next() == JobEnd("length")


@pytest.mark.asyncio
async def test_min_tokens_counts_over_every_push() -> None:
    stream = OutputStream(stops=("S",), min_tokens=2)
    assert not stream.push("aS", [1, 2])  # 2 tokens: not more than min_tokens yet
    assert stream.push("bS", [3])


@pytest.mark.asyncio
async def test_a_reader_behind_gets_one_merged_delta_and_a_waiting_reader_wakes() -> None:
    stream = OutputStream()
    for i in range(5):
        stream.push(f"t{i} ", [i])
    assert await stream.next() == TokenDelta("t0 t1 t2 t3 t4 ", [0, 1, 2, 3, 4])
    reader = asyncio.ensure_future(stream.next())
    await asyncio.sleep(0)
    assert not reader.done()
    stream.push("x", [9])
    assert await reader == TokenDelta("x", [9])
    stream.finish(None, "engine error")
    stream.finish("stop")  # ignored: a job ends once
    assert await stream.next() == JobEnd(None, "engine error")
    assert await stream.next() == JobEnd(None, "engine error")  # the end stays


@pytest.mark.asyncio
async def test_the_first_prediction_reaches_the_reader_or_the_end_does() -> None:
    stream = OutputStream()
    waiting = asyncio.ensure_future(stream.prediction())
    await asyncio.sleep(0)
    stream.set_prediction(120.0)
    stream.set_prediction(300.0)  # only the first counts
    assert await waiting == 120.0
    unpredicted = OutputStream()
    unpredicted.finish("abort")
    assert await unpredicted.prediction() is None
