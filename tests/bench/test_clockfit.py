"""`python -m bench.clockfit` times the clock's refits both ways and prints them."""

from __future__ import annotations

import pytest

from bench import clockfit


def test_it_times_refits_with_loaded_and_one_blas_thread(capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    assert clockfit.main(["--fits", "3", "--spinners", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "3 fits of a 1024-sample window" in lines[0]
    assert lines[1].startswith("BLAS as loaded") and lines[2].startswith("one BLAS thread")
    assert all("fit median" in line and "longest" in line for line in lines[1:])
