"""The scrape-cost benchmark runs and reports both variants."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.scrape_cost import main


def test_prints_one_line_per_policy_and_queue(smollm2_model: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", str(smollm2_model), "--waiting", "0", "20", "--policies", "ssjf",
                 "--renders", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [["ssjf", "waiting=0"], ["ssjf", "waiting=20"]]
    assert all("with_router=" in line for line in lines)
