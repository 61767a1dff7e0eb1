"""`lengthwise profile --learned`: a running daemon's learned clock as a cost profile, and
the simulator running on it."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bench import costfile
from bench.learned import Sampler, profile_from_metrics
from bench.profile import main
from bench.sim import SimOptions, simulate
from bench.sim.overrides import build_config
from bench.sim.predictions import Estimate
from bench.workload import Message, Request
from daemon.config import Config, CostModelConfig, EngineConfig, ModelConfig, SchedulerConfig
from daemon.core.costmodel import TERMS, CostModel
from daemon.core.job import SamplingSpec
from daemon.service import Service
from tests.support import sim_profile


async def _learn(config: Config) -> tuple[str, CostModel]:
    """Serve a few jobs on the config's simulated engine until its clock fitted: /metrics'
    text and the clock's cost model."""
    service = await Service.create(config)
    await service.start()
    try:
        for i in range(6):
            service.submit(service.new_job(list(range(1, 40 + 20 * i)),
                                           SamplingSpec(max_tokens=60, ignore_eos=True), 0, "t"))
        lane = service.scheduler.lanes[0]
        async with asyncio.timeout(20):
            while lane.clock.fits < 3:
                await asyncio.sleep(0.01)
        return service.metrics.render().decode(), lane.clock.cost
    finally:
        await service.scheduler.abort_all(5)
        await service.shutdown()


def test_a_daemons_learned_clock_becomes_a_profile_the_simulator_runs(
        smollm2_model: Path, tmp_path: Path) -> None:
    # A simulated engine 4x faster than the generic one (the profile is the engine the
    # daemon serves on and where its clock starts).
    sim_profile(tmp_path / "fast.json", prefill_base_s=0.001, prefill_per_token_s=5e-6,
                decode_base_s=0.002, decode_per_seq_s=0.000125,
                decode_per_context_token_s=5e-8)
    config = Config(model=ModelConfig(path=str(smollm2_model)),
                    engine=EngineConfig(kind="sim", max_num_seqs=4),
                    scheduler=SchedulerConfig(max_running=4),
                    costmodel=CostModelConfig(profile=str(tmp_path / "fast.json")))
    text, learned = asyncio.run(_learn(config))
    profile = profile_from_metrics(text, "fast-sim", "test")
    assert "learned by the daemon at test" in profile.source and profile.max_num_seqs == 4
    assert CostModel.from_sim(profile.sim) == learned
    costfile.save(profile, tmp_path / "learned.json")
    # The simulator runs on the snapshot (as `lengthwise sim --profile learned.json`).
    loaded = costfile.load(tmp_path / "learned.json")
    reqs = [Request(i, 0.01 * i, [Message("user", "x")], 30, 40) for i in range(12)]
    run = simulate(reqs, [Estimate(40.0)] * 12, SimOptions(
        config=build_config(overrides=["scheduler.policy=ssjf", "scheduler.max_running=2"]),
        sim=loaded.sim))
    assert all(r.ok for r in run.results)
    # Its jobs took the snapshot engine's time: 40 steps of ~2.3 ms each, not 8.5 ms.
    assert min(r.jct_s for r in run.results) < 40 * 0.004
    assert all(getattr(loaded.sim, t) >= 0 for t in TERMS)


def test_nothing_learned_yet_is_refused_and_model_or_learned_is_required() -> None:
    with pytest.raises(ValueError, match="not learned any engine step"):
        profile_from_metrics('lengthwise_step_samples_total{executor="a"} 0.0\n', "x")
    with pytest.raises(SystemExit):
        main(["--out", "unused.json"])


def _clock_text(decode_base_s: float, samples: int) -> str:
    """/metrics as a daemon whose clock learned these coefficients from `samples` steps."""
    lines = [f'lengthwise_step_coefficient_seconds{{executor="e0",term="{term}"}} '
             f'{decode_base_s if term == "decode_base_s" else 1e-6}' for term in TERMS]
    return "\n".join([*lines, f'lengthwise_step_samples_total{{executor="e0"}} {samples}',
                      "lengthwise_max_running 4", ""])


def test_a_run_is_simulated_on_its_clock_over_the_run_not_at_its_end() -> None:
    """Sampler fetches the learned clock every period while the run goes and once at its
    end: the profile is their mean. A fetch before anything was learned counts for none."""
    fetched: list[int] = []

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the k-th fetch: a clock of (k x 2 ms) decode steps
            fetched.append(len(fetched))
            body = _clock_text(0.002 * len(fetched), samples=len(fetched) - 1).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with Sampler(f"http://127.0.0.1:{server.server_port}", "run", period_s=0.05) as sampler:
            while len(fetched) < 4:
                time.sleep(0.01)
    finally:
        server.shutdown()
        server.server_close()
    taken = [p.sim.decode_base_s for p in sampler.snapshots]
    assert len(taken) == len(fetched) - 1 >= 4  # the first fetch had learned nothing
    assert taken == pytest.approx([0.002 * k for k in range(2, len(fetched) + 1)])
    assert sampler.profile().sim.decode_base_s == pytest.approx(statistics.fmean(taken))
    assert "mean of" in sampler.profile().source
    with pytest.raises(ValueError, match="no learned clock"):
        Sampler("http://127.0.0.1:9", "none").profile()
