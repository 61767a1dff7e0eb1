"""The profile fit recovers a known cost model from its own points."""

from __future__ import annotations

import pytest

from bench.costfile import Point
from bench.fit import fit_points, predict
from daemon.config import SimConfig

TRUE = SimConfig(prefill_base_s=0.005, prefill_per_token_s=2e-5, decode_base_s=0.002,
                 decode_per_seq_s=1e-4, decode_per_context_token_s=1e-7)


def test_fit_recovers_coefficients() -> None:
    shapes = [Point(kind="prefill", batch=1, input_tokens=n, context_tokens=n, seconds=0.0)
              for n in (16, 128, 512, 1024)]
    shapes += [Point(kind="decode", batch=b, input_tokens=n, context_tokens=b * (n + 24),
                     seconds=0.0) for b in (1, 2, 4) for n in (32, 512, 1024)]
    points = [Point(kind=p.kind, batch=p.batch, input_tokens=p.input_tokens,
                    context_tokens=p.context_tokens, seconds=predict(TRUE, p)) for p in shapes]
    sim, report, fitted = fit_points(points)
    for name in ("prefill_base_s", "prefill_per_token_s", "decode_base_s", "decode_per_seq_s",
                 "decode_per_context_token_s"):
        assert getattr(sim, name) == pytest.approx(getattr(TRUE, name), rel=1e-3)
    assert report.decode_max_error < 1e-6 and report.prefill_max_error < 1e-6
    assert all(p.predicted == pytest.approx(p.seconds) for p in fitted)
