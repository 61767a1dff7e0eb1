"""Concurrent engine builds: each spawned process keeps the environment of its own build,
and builds overlap once their processes exist (real threads, real spawned processes)."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
from multiprocessing.queues import Queue
from typing import Any

import pytest

from daemon.executors import enginefork
from daemon.executors.spawn import build_with_env

_KEY = "LENGTHWISE_TEST_SPAWN_ENV"


def report_env(queue: Queue[tuple[str, str | None]], name: str) -> None:
    queue.put((name, os.environ.get(_KEY)))


@pytest.mark.asyncio
@pytest.mark.parametrize(("method", "notifies"), [("spawn", False), ("enginefork", True)])
async def test_concurrent_builds_keep_their_own_environment(method: str, notifies: bool) -> None:
    # As vLLM starts its engine processes: spawned (found among our children), or forked
    # by enginefork's context, which says when a child has started (not polled).
    context: Any = (multiprocessing.get_context("spawn") if method == "spawn"
                    else enginefork._FORK)
    queue: Queue[tuple[str, str | None]] = context.Queue()
    spawned = {"a": threading.Event(), "b": threading.Event()}
    overlapped: list[str] = []

    def build(name: str, other: str) -> str:
        child = context.Process(target=report_env, args=(queue, name))
        child.start()
        spawned[name].set()
        # "Loading": a build that ran alone from start to end would never see the other
        # one's process appear meanwhile.
        if spawned[other].wait(timeout=20):
            overlapped.append(name)
        child.join(60)
        return name

    results = await asyncio.gather(
        asyncio.to_thread(build_with_env, {_KEY: "engine-a"}, lambda: build("a", "b"), notifies),
        asyncio.to_thread(build_with_env, {_KEY: "engine-b"}, lambda: build("b", "a"), notifies))
    assert results == ["a", "b"]
    seen = dict(queue.get(timeout=10) for _ in range(2))
    assert seen == {"a": "engine-a", "b": "engine-b"}
    assert sorted(overlapped) == ["a", "b"]
    os.environ.pop(_KEY, None)


def test_a_failed_build_raises_in_the_caller() -> None:
    def build() -> None:
        raise ValueError("no engine")

    with pytest.raises(ValueError, match="no engine"):
        build_with_env({_KEY: None}, build)
