"""Stop strings over the text of all dispatches: held-back tails, straddling matches,
min_tokens, the first-completing match, and the job flushing what it held back."""

from __future__ import annotations

import pytest

from daemon.core.job import Job, JobEnd, JobStatus, SamplingSpec, TokenDelta
from daemon.core.stopstrings import StopScan, scan


def test_no_stop_strings_release_everything() -> None:
    assert scan("", "abc", (), True) == StopScan("abc", "", False)


def test_a_possible_stop_prefix_is_held_back() -> None:
    assert scan("", "hello wor", ("world!",), True) == StopScan("hell", "o wor", False)


def test_a_match_straddling_held_and_new_text_stops() -> None:
    assert scan("o wor", "ld! more", ("world!",), True) == StopScan("o ", "", True)


def test_the_match_that_completes_first_wins_then_list_order() -> None:
    assert scan("", "xabcdy", ("abcd", "bc"), True) == StopScan("xa", "", True)
    assert scan("", "xabcy", ("bc", "abc"), True) == StopScan("xa", "", True)
    assert scan("", "xbcy", ("bc", "b"), True).release == "x"


def test_before_min_tokens_nothing_matches_and_old_text_is_not_rescanned() -> None:
    early = scan("", "a STOP b", ("STOP",), False)
    assert not early.stopped
    # Once checking starts, only matches that end in the new text count (as in vLLM).
    later = scan(early.held, "c", ("STOP",), True)
    assert not later.stopped and early.release + later.release + later.held == "a STOP bc"


@pytest.mark.parametrize("cut", range(1, 12))
def test_emit_over_any_cut_gives_the_uncut_result(cut: int) -> None:
    """Two deltas split anywhere give what one delta gives: the text before the stop."""
    text = "one two three four"
    job = Job("j", [1], SamplingSpec(max_tokens=10, stop=("three",)), 0.0)
    stopped = [job.emit(text[:cut], [1], 0.0), job.emit(text[cut:], [2], 0.0)]
    assert stopped == [False, True]
    released = [job.outputs.get_nowait() for _ in range(job.outputs.qsize())]
    assert "".join(d.text for d in released if isinstance(d, TokenDelta)) == "one two "


def test_held_text_is_flushed_when_the_job_ends_without_a_stop() -> None:
    job = Job("j", [1], SamplingSpec(max_tokens=10, stop=("xyz",)), 0.0)
    assert not job.emit("abcx", [1], 0.0)
    job.end(JobStatus.FINISHED, 1.0, "length")
    items = [job.outputs.get_nowait() for _ in range(job.outputs.qsize())]
    assert items == [TokenDelta("ab", [1]), TokenDelta("cx", []), JobEnd("length")]
