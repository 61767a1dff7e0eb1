"""`python -m bench.clockfit` times the clock's refits alone and beside a busy thread, and
how late the event loop's timers fire with the fits on the loop and in a worker."""

from __future__ import annotations

import pytest

from bench import clockfit


def test_it_times_refits_alone_and_beside_a_busy_thread(capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    assert clockfit.main(["--fits", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "3 fits of a 1024-sample window" in lines[0]
    assert lines[1].startswith("alone: fit") and lines[4].startswith("beside a thread busy")
    assert all("median" in line and "longest" in line for line in lines[1:])
    assert [line.split(" median")[0].strip() for line in lines[2:4]] == [
        "loop timer late, fit on the loop", "loop timer late, fit in a worker"]
