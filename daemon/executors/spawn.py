"""Building engines off the event loop, several at once, each with its own environment.

vLLM's engine constructor blocks until its engine process has loaded the model (seconds to
minutes), and that process reads its settings (CPU core binding, visible GPUs, KV size)
from the environment it inherits when it is forked. So each build runs in a worker thread,
and builds take turns only for the short part that must not overlap: setting the
environment up to the moment the engine's process exists. Model loading then proceeds in
all engine processes at once while the event loop keeps serving.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import psutil

T = TypeVar("T")
Env = Mapping[str, str | None]  # None removes the variable

_FORK_LOCK = threading.Lock()  # one build between "set the environment" and "forked"
_POLL_S = 0.02  # how often a build looks for its engine process while holding the lock
_building = threading.local()  # .started: the Event of the build running in this thread


def _child_pids() -> set[int]:
    """Children started by multiprocessing's spawn method (vLLM's engine processes), once
    they run Python: by then they hold their own environment. They show as spawn_main
    until vLLM renames them ("VLLM::EngineCore"). multiprocessing's resource tracker, also
    a child, is not one of them."""
    pids = set()
    for child in psutil.Process().children():
        try:
            command = " ".join(child.cmdline())
        except psutil.Error:  # gone already, or a zombie
            continue
        if ("spawn_main" in command or "VLLM::" in command) and "resource_tracker" not in command:
            pids.add(child.pid)
    return pids


def _apply(env: Env) -> None:
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def notify_started() -> None:
    """Called by a process class that knows when its child has its environment
    (enginefork): the build in this thread may let the next one change it."""
    started = getattr(_building, "started", None)
    if started is not None:
        started.set()


def build_with_env(env: Env, build: Callable[[], T], notifies: bool = False) -> T:
    """Call build() with `env` applied to this process's environment, holding the others
    off until build() has started a child process (a spawned child among ours, or, when
    `notifies`, one that says so through notify_started) or returned: from then on the
    child has its copy and the next build may change the environment. Blocks: call it
    from a worker thread (asyncio.to_thread)."""
    started = threading.Event()

    def run() -> T:
        _building.started = started
        try:
            return build()
        finally:
            _building.started = None

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-build") as pool:
        with _FORK_LOCK:
            before = _child_pids()
            _apply(env)
            building = pool.submit(run)
            # A build that notifies is not polled: listing children scans /proc, which
            # takes the GIL from the event loop for as long as the forkserver's first
            # start lasts (seconds).
            while not building.done() and not started.wait(_POLL_S):
                if not notifies and _child_pids() - before:
                    break
        return building.result()  # waits for the build; raises what it raised
