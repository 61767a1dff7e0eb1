"""One long streamed request with a short one sent beside it once the long one is under way
(alise then preempts the long request for the short one): the differential suites' way to
check that a preempted and resumed answer is the uninterrupted one, on every API."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

Tick = Callable[[], None]


def ticking(lines: Iterator[str], tick: Tick) -> Iterator[str]:
    """`lines`, calling `tick` as each one is read."""
    for line in lines:
        tick()
        yield line


def streamed(client: httpx.Client, path: str, body: dict[str, Any],
             merge: Callable[[Iterator[str]], dict[str, Any]], tick: Tick) -> dict[str, Any]:
    """One streamed request to the tiny model, its lines merged by `merge`, `tick` called
    as each line is read."""
    with client.stream("POST", path, json={"model": "tiny-llama", **body}) as response:
        assert response.status_code == 200, response.read()
        return merge(ticking(response.iter_lines(), tick))


def while_streaming(base_url: str, long: Callable[[httpx.Client, Tick], dict[str, Any]],
                    after: int, short: Callable[[httpx.Client], object]) -> dict[str, Any]:
    """`long(client, tick)` streams one request and calls `tick` for each unit it reads;
    once it has read `after` of them, `short(client)` is sent. Returns long's answer."""
    started = threading.Event()
    seen = [0]

    def tick() -> None:
        seen[0] += 1
        if seen[0] >= after:
            started.set()

    def run_long() -> dict[str, Any]:
        with httpx.Client(base_url=base_url, timeout=120) as client:
            return long(client, tick)

    with ThreadPoolExecutor(1) as pool, httpx.Client(base_url=base_url, timeout=120) as client:
        answer = pool.submit(run_long)
        assert started.wait(120)
        short(client)
        return answer.result(timeout=120)
