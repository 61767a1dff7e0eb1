"""How a conversation becomes encoder input: history + current prompt, newest text kept."""

from __future__ import annotations

from collections.abc import Sequence

from predictor.records import Message

Turn = Message  # one chat turn (role, content)


def render(messages: Sequence[Turn]) -> str:
    """Role-tagged turns, oldest first; the encoder keeps the *last* N tokens (SSJF)."""
    return "\n".join(f"{m.role}: {m.content}" for m in messages)


def current_prompt(messages: Sequence[Turn]) -> str:
    """The user turn being answered (the last one)."""
    return messages[-1].content if messages else ""


def history(messages: Sequence[Turn]) -> Sequence[Turn]:
    return messages[:-1]
