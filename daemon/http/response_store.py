"""Where /v1/responses keeps stored responses (`store`, the default, as vLLM's server with
VLLM_ENABLE_RESPONSES_API_STORE=1): in the daemon's memory, least recently used first out,
at most MAX_RESPONSES entries and MAX_BYTES of encoded JSON (response, the conversation
`previous_response_id` continues, a background stream's events). vLLM's store never
forgets; this one is bounded, so an evicted id gets vLLM's 404, as an unknown one does.
Nothing survives a restart."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field

import msgspec

from daemon.http.responses_objects import ResponseObject
from daemon.http.schemas import ChatMessage

MAX_RESPONSES = 10_000
MAX_BYTES = 256 * 1024 * 1024


@dataclass(slots=True, eq=False)
class Entry:
    """One stored response: its conversation from creation on, the response once there
    is one (a background response's at once, status "queued"), and for a background
    stream its events so far (GET ...?stream=true replays them)."""

    messages: list[ChatMessage]
    response: ResponseObject | None = None
    events: list[bytes] | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # new events, or done
    finished: bool = False
    size: int = 0

    def measure(self) -> int:
        self.size = len(msgspec.json.encode(self.messages)) + sum(map(len, self.events or []))
        if self.response is not None:
            self.size += len(msgspec.json.encode(self.response))
        return self.size


class ResponseStore:
    def __init__(self, max_responses: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self.num_bytes = 0
        self._entries: OrderedDict[str, Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, response_id: str) -> Entry | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def put(self, response_id: str, entry: Entry) -> None:
        """Add or update (after a change to the entry), then evict the least recently
        used others until both bounds hold."""
        old = self._entries.pop(response_id, None)
        if old is not None:
            self.num_bytes -= old.size
        self.num_bytes += entry.measure()
        self._entries[response_id] = entry
        while len(self._entries) > 1 and (len(self._entries) > self.max_responses
                                          or self.num_bytes > self.max_bytes):
            _, gone = self._entries.popitem(last=False)
            self.num_bytes -= gone.size

    def add_event(self, response_id: str, entry: Entry, event: bytes) -> None:
        assert entry.events is not None
        entry.events.append(event)
        entry.changed.set()
        if response_id in self._entries:  # counted as it grows
            self.num_bytes += len(event)
            entry.size += len(event)
