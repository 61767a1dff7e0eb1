"""The training / request-log record (one answered user turn, JSONL) and how a conversation
becomes text: role-tagged turns, oldest first, of which the encoders keep the newest."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import msgspec

log = logging.getLogger(__name__)


class Message(msgspec.Struct, frozen=True):
    role: str  # "user" | "assistant" | "system"
    content: str


Turn = Message  # one chat turn (role, content)


class Record(msgspec.Struct, frozen=True):
    """Also the daemon's request-log line, so a deployment can retrain on its own outputs."""

    id: str  # "<conversation id>#<turn index>" for ShareGPT; the request id for the daemon log
    messages: list[Message]  # conversation up to and including the user turn being answered
    response: str
    output_tokens: int  # length of `response` under the serving model's tokenizer


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Record)


def render(messages: Sequence[Turn]) -> str:
    """Role-tagged turns, oldest first; the encoder keeps the *last* N tokens (SSJF)."""
    return "\n".join(f"{m.role}: {m.content}" for m in messages)


def current_prompt(messages: Sequence[Turn]) -> str:
    """The user turn being answered (the last one)."""
    return messages[-1].content if messages else ""


def conversation_key(record_id: str) -> str:
    """The conversation a record belongs to: everything before the last '#', if any."""
    head, sep, _ = record_id.rpartition("#")
    return head if sep else record_id


def is_first_turn(record: Record) -> bool:
    """The record answers the conversation's first user turn (no history to learn from)."""
    return sum(m.role == "user" for m in record.messages) == 1


def encode_record(record: Record) -> bytes:
    return _encoder.encode(record)


def read_records(path: str | Path) -> Iterator[Record]:
    """Records of a JSONL file. A last line that does not decode is a write torn by a crash
    (the daemon's request log appends one line per completion): it is skipped with a
    warning. An undecodable line anywhere else is an error."""
    torn: tuple[int, msgspec.DecodeError] | None = None
    with open(path, "rb") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            if torn is not None:
                raise ValueError(f"{path}:{torn[0]}: bad record: {torn[1]}") from torn[1]
            try:
                record = _decoder.decode(line)
            except msgspec.DecodeError as e:
                torn = (line_no, e)
                continue
            if not record.messages or record.messages[-1].role != "user":
                raise ValueError(f"{path}:{line_no}: messages must end with a user turn")
            yield record
    if torn is not None:
        log.warning("%s:%d: skipped a torn last line (%s)", path, torn[0], torn[1])


def write_records(path: str | Path, records: Iterable[Record]) -> int:
    """Writes to a temp file then renames, so a killed run never leaves half a data set."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    count = 0
    with open(tmp, "wb") as f:
        for record in records:
            f.write(encode_record(record) + b"\n")
            count += 1
    tmp.replace(path)
    return count
