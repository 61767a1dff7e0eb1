"""The starts admission promised and the error it learns from them (core/promises.py)."""

from __future__ import annotations

import pytest

from daemon.core.promises import COLD_RATIO, ERROR_HORIZON_S, MIN_ERRORS, RATIO_FLOOR_S, Promises


def test_a_start_is_a_sample_of_its_forecasts_error_apart_by_forecast() -> None:
    promises = Promises()
    promises.promise("a", 10.0, 2.0, memory=False)
    promises.promise("b", 10.0, 0.01, memory=True)  # a wait under the floor counts as it
    promises.started("a", 13.0)
    promises.started("b", 10.2)
    promises.started("a", 20.0)  # once only: the promise left with its first start
    assert promises.ratios(False, 20.0) == [pytest.approx(1.5)]
    assert promises.ratios(True, 20.0) == [pytest.approx(0.2 / RATIO_FLOOR_S)]


def test_a_job_that_never_started_teaches_nothing() -> None:
    promises = Promises()
    promises.promise("a", 0.0, 1.0, memory=False)
    promises.forget("a")
    promises.started("a", 5.0)
    assert promises.ratios(False, 5.0) == []


def test_the_margin_is_a_percentile_of_recent_samples_once_there_are_enough() -> None:
    promises = Promises()
    for k in range(MIN_ERRORS - 1):
        promises.record(False, 0.0, 1.0 + k)
    assert not promises.learned(False, 0.0)
    assert promises.margin(False, 0.0, 50.0) == COLD_RATIO
    promises.record(False, 0.0, 1.0 + MIN_ERRORS - 1)
    assert promises.learned(False, 0.0)
    assert promises.margin(False, 0.0, 50.0) == pytest.approx(1.0 + (MIN_ERRORS - 1) / 2)
    assert promises.margin(False, 0.0, 10.0) < promises.margin(False, 0.0, 90.0)
    assert not promises.learned(True, 0.0)  # the memory bound's are its own
    assert not promises.learned(False, ERROR_HORIZON_S + 1.0)  # they lapse
