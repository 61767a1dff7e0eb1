"""Stop strings, checked by the daemon over the text already generated plus the new text.

vLLM checks stop strings only in the text of one engine request. A preempted job resumes as
a new engine request whose prompt holds the tokens already generated, so a stop string that
straddles the preemption point would be missed, and the few characters vLLM holds back (a
possible start of a stop string) would be lost when the first request is aborted. The job
therefore keeps its own held-back tail across dispatches and the engine gets no stop
strings.

Semantics follow vLLM's detokenizer: a match must end in the new text, the one that
completes first wins, none is looked for until more than `min_tokens` tokens exist, the
stop string itself is not part of the output, and up to len(longest stop string) - 1
characters are held back while streaming. One difference: vLLM drops tokens that follow
the stop string within one engine step; a delta here may merge several steps (when the
loop lags), and its tokens all count in usage.
"""

from __future__ import annotations

import msgspec


class StopScan(msgspec.Struct, frozen=True):
    """What a delta gives once stop strings are applied."""

    release: str  # text the client may see now
    held: str  # text kept back: it may be the start of a stop string
    stopped: bool  # a stop string was found: the job ends with finish reason "stop"


def scan(held: str, new: str, stops: tuple[str, ...], check: bool) -> StopScan:
    """Apply `stops` to `held` (kept back from earlier deltas) + `new`. `check` is False
    while the job has not generated more than min_tokens tokens."""
    if not stops:
        return StopScan(held + new, "", False)
    text = held + new
    if check:
        # Only matches that end inside the new text: earlier text was checked already
        # (or was generated before min_tokens was reached, where vLLM does not look).
        # The match that completes first wins, ties by list order (as in vLLM).
        matches = [(i + len(stop), k, i) for k, stop in enumerate(stops)
                   if (i := text.find(stop, max(len(held) - len(stop) + 1, 0))) >= 0]
        if matches:
            return StopScan(text[:min(matches)[2]], "", True)
    keep = max(len(stop) for stop in stops) - 1
    cut = max(len(text) - keep, 0)
    return StopScan(text[:cut], text[cut:], False)
