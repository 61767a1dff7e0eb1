"""The event loop's watch (daemon/http/loopwatch.py): the lag probe observes a blocked
loop's late timer, and the watcher thread logs, once per block, where the loop's thread
was while it did not run; cancelling the watch stops the thread."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from daemon.http.loopwatch import LoopWatch


def _hog_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # the point: a synchronous call on the loop's thread


@pytest.mark.asyncio
async def test_a_block_is_logged_once_with_the_loops_stack(
        caplog: pytest.LogCaptureFixture) -> None:
    lags: list[float] = []
    watch = LoopWatch(lags.append, probe_s=0.02, blocked_s=0.2)
    task = asyncio.create_task(watch.run())
    await asyncio.sleep(0.1)  # the probe runs; its watcher thread is up
    assert any(t.name == "loop-watch" for t in threading.enumerate())
    with caplog.at_level(logging.WARNING, logger="daemon.http.loopwatch"):
        _hog_the_loop(0.6)  # three times the threshold: still one line
        await asyncio.sleep(0.1)
    blocks = [r for r in caplog.records if "has not run for" in r.getMessage()]
    assert len(blocks) == 1 and watch.blocks == 1
    assert "_hog_the_loop" in blocks[0].getMessage()  # where the loop was
    assert max(lags) > 0.4  # the probe's timer fired that late
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert not any(t.name == "loop-watch" for t in threading.enumerate())


@pytest.mark.asyncio
async def test_a_loop_that_keeps_turning_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    watch = LoopWatch(lambda lag: None, probe_s=0.02, blocked_s=0.2)
    task = asyncio.create_task(watch.run())
    with caplog.at_level(logging.WARNING, logger="daemon.http.loopwatch"):
        for _ in range(5):
            _hog_the_loop(0.05)  # short blocks, below the threshold
            await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert watch.blocks == 0 and not caplog.records


@pytest.mark.asyncio
async def test_a_slow_garbage_collection_is_logged(caplog: pytest.LogCaptureFixture,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Once start-up has frozen the heap, any collection past the threshold (here 0 s:
    every one) is logged with its generation; before, none (start-up's own); the callback
    is gone once the watch stops."""
    import gc

    monkeypatch.setattr("daemon.http.loopwatch.SLOW_GC_S", 0.0)
    watch = LoopWatch(lambda lag: None, probe_s=0.02, blocked_s=5.0)
    task = asyncio.create_task(watch.run())
    await asyncio.sleep(0.05)
    with caplog.at_level(logging.WARNING, logger="daemon.http.loopwatch"):
        monkeypatch.setattr(gc, "get_freeze_count", lambda: 0)
        gc.collect(2)
        assert not caplog.records
        monkeypatch.setattr(gc, "get_freeze_count", lambda: 1000)
        gc.collect(2)
    assert any("garbage collection of generation 2" in r.getMessage() for r in caplog.records)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert watch._on_gc not in gc.callbacks
