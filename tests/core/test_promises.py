"""The starts admission promised and the error it learns from them (core/promises.py)."""

from __future__ import annotations

import pytest

from daemon.core.promises import (
    COLD_RATIO,
    ERROR_HORIZON_S,
    MIN_ERRORS,
    RATIO_FLOOR_S,
    Promises,
    depth_band,
)


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


def test_by_depth_the_margin_reads_forecasts_made_at_about_the_same_depth() -> None:
    promises = Promises()
    for k in range(MIN_ERRORS):
        promises.record(False, 0.0, 0.5, depth_band(1))  # shallow forecasts came early
        promises.record(False, 0.0, 3.0, depth_band(20))  # deep ones three times late
    everything = promises.margin(False, 0.0, 50.0, ahead=20)
    assert everything == pytest.approx(1.75)  # off: one margin over all of them
    promises.by_depth = True
    assert promises.margin(False, 0.0, 50.0, ahead=20) == pytest.approx(3.0)
    assert promises.margin(False, 0.0, 50.0, ahead=24) == pytest.approx(3.0)  # a band beside
    assert promises.margin(False, 0.0, 50.0, ahead=0) == pytest.approx(0.5)
    # with fewer than MIN_ERRORS near its depth, a forecast reads them all
    assert promises.margin(False, 0.0, 50.0, ahead=6) == pytest.approx(1.75)
    assert promises.margin(False, 0.0, 50.0) == pytest.approx(1.75)  # no depth: all


def test_a_promise_keeps_the_depth_it_was_made_at() -> None:
    promises = Promises()
    promises.by_depth = True
    for k in range(MIN_ERRORS):
        promises.promise(f"deep{k}", 0.0, 1.0, memory=False, ahead=16)
        promises.started(f"deep{k}", 4.0)
    assert promises.ratios(False, 4.0, ahead=16) == [pytest.approx(4.0)] * MIN_ERRORS
    assert promises.margin(False, 4.0, 50.0, ahead=1) == pytest.approx(4.0)  # all: too few near
