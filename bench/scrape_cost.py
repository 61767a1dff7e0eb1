"""What one /metrics scrape costs the event loop, with and without the router families.

A router's endpoint picker may scrape every pod every 50 ms, and the scrape runs on the
daemon's one event loop. This renders /metrics in-process (simulated executors, jobs held
waiting with predictions) and prints the median render time.

    python -m bench.scrape_cost --waiting 0 1000 --policies fcfs alise
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from daemon.config import Config, EngineConfig, ModelConfig, SchedulerConfig
from daemon.core.job import SamplingSpec
from daemon.http.metrics import Metrics
from daemon.http.routermetrics import RouterCollector
from daemon.service import Service


async def measure(model: str, policy: str, waiting: int, renders: int) -> dict[bool, float]:
    """Median render ms {False: lengthwise's own metrics, True: plus the router families}
    with 8 executors x 4 running jobs and `waiting` jobs queued."""
    config = Config(model=ModelConfig(path=model),
                    engine=EngineConfig(kind="sim", devices=["cpu"] * 8, max_num_seqs=4),
                    scheduler=SchedulerConfig(policy=policy, max_running=4,
                                              max_waiting=waiting + 100))
    service = await Service.create(config)
    await service.start()
    for i in range(waiting + 32):
        job = service.new_job(list(range(1, 200)),
                              SamplingSpec(max_tokens=1000, ignore_eos=True), 0, "cost")
        job.predicted_output_tokens = 50 + (i * 37) % 900  # spread, so order keys differ
        service.submit(job)
    await asyncio.sleep(0.05)  # the first 32 are admitted
    medians = {}
    for router in (False, True):
        metrics = Metrics()
        metrics.watch(service.scheduler, service.predictions, service.executors)
        if router:
            metrics.registry.register(RouterCollector(service))
        times = []
        for _ in range(renders):
            start = time.perf_counter()
            metrics.render()
            times.append(time.perf_counter() - start)
        medians[router] = statistics.median(times) * 1000
    await service.scheduler.abort_all(5)
    await service.shutdown()
    return medians


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scrape_cost")
    p.add_argument("--model", default="models/smollm2-135m-instruct", help="tokenizer folder")
    p.add_argument("--waiting", type=int, nargs="+", default=[0, 1000])
    p.add_argument("--policies", nargs="+", default=["fcfs", "alise"])
    p.add_argument("--renders", type=int, default=100)
    args = p.parse_args(argv)
    for policy in args.policies:
        for waiting in args.waiting:
            ms = asyncio.run(measure(args.model, policy, waiting, args.renders))
            print(f"{policy} waiting={waiting} render_ms own={ms[False]:.2f} "
                  f"with_router={ms[True]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
