"""`lengthwise bench frontier`: systems as overrides, calibration, table, JSON and plot."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from bench.cli import main
from bench.frontier.report import FrontierResults
from bench.frontier.run import calibrate
from bench.frontier.systems import group_of, parse_system, with_baseline
from tests.bench.records import long_and_short


def test_systems_parse_and_fcfs_comes_first() -> None:
    s = parse_system("ssjf-age4=scheduler.policy=ssjf,scheduler.aging.promote_after_s=4")
    assert s.label == "ssjf-age4"
    assert s.overrides == ["scheduler.policy=ssjf", "scheduler.aging.promote_after_s=4"]
    assert parse_system("isrtf").overrides == ["scheduler.policy=isrtf"]
    assert [x.label for x in with_baseline([s, parse_system("isrtf")])] == [
        "fcfs", "ssjf-age4", "isrtf"]
    assert (group_of("ssjf-age4"), group_of("oracle-sjf-age1"), group_of("isrtf")) == (
        "ssjf", "oracle-sjf", "isrtf")


def test_calibrate_finds_the_rate_from_either_side() -> None:
    # An M/M/1-like curve: mean JCT / unloaded = 1 / (1 - rate / 10); 3x at rate 6.67.
    curve = lambda r: 1.0 / (1.0 - r / 10.0) if r < 10 else 1e9
    for guess in (0.01, 50.0):
        rate, ratio = calibrate(curve, 1.0, 3.0, guess=guess, tol=0.005)
        assert rate == pytest.approx(20 / 3, rel=0.01) and ratio == pytest.approx(3, rel=0.005)


def test_frontier_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = long_and_short(tmp_path, 60, every=5, long=400, short=12)
    out = tmp_path / "f"
    # the absolute bound alone (slowdown 0), 1 s or 60 s
    sjf = "scheduler.policy=oracle-sjf,scheduler.aging.slowdown=0,scheduler.aging.promote_after_s="
    assert main(["frontier", "--lengths", f"records:{records}", "--num", "60",
                 "--predictor", "oracle", "--calibrate", "2", "--out", str(out),
                 "--system", f"sjf-age1={sjf}1", "--system", f"sjf-age60={sjf}60"]) == 0
    printed = capsys.readouterr()
    assert "calibrated:" in printed.err and "| sjf-age60 |" in printed.out
    res = msgspec.json.decode((out / "frontier.json").read_bytes(), type=FrontierResults)
    assert [r.system.label for r in res.rows] == ["fcfs", "sjf-age1", "sjf-age60"]
    assert res.fcfs_load_ratio == pytest.approx(2.0, rel=0.02) and res.sample == "external"
    assert res.rows[0].vs_fcfs["mean_jct"] == 1.0
    for row in res.rows:
        assert row.system.summary.n_completed == 60
    # Shortest-first with true lengths and no effective aging beats FCFS on the mean.
    assert res.rows[2].vs_fcfs["mean_jct"] < 0.9
    assert (out / "frontier.png").stat().st_size > 0 and (out / "frontier.md").exists()


def test_frontier_refuses_a_bad_system(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frontier", "--system", "x=scheduler.aging.promote_after=4"]) == 2
    assert "promote_after" in capsys.readouterr().err
