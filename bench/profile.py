"""`lengthwise profile --model DIR --out FILE.json`: measure the engine, fit the cost model.

Prefill: one request of L prompt tokens and max_tokens=1; its time to first token is one
step with a prefill of L. Decode: B concurrent requests of L-token prompts and T forced
output tokens; (last finish - last first token) / (T - 1) is one decode step of B sequences
at a mean context of B x (L + T/2). The fit is SimExecutor's step model (daemon/executors/
sim.py), so the simulator and ALISE/SCLS estimators read the coefficients directly:
    step = [prefill_base + prefill_per_token x new] + decode_base + decode_per_seq x B
           + decode_per_context_token x context.
Decode is fitted first; prefill is fitted to TTFT minus the decode part of that step. Both by
non-negative least squares on relative error (every point weighs the same, whatever its size).
With `--through URL` the same requests go over HTTP to a running server, so the profile
includes what the bare engine does not: the daemon, streaming, and the client and server
sharing the CPU with the engine. Only this module of bench/ imports vLLM.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bench.costfile import Point, Profile, save, toml_section
from bench.fit import fit_points
from bench.hostload import CpuMeter, CpuShare


def _engine(model: str, max_num_seqs: int, kv_gib: int) -> Any:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_gib))
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    # The daemon's engine settings (daemon/executors/vllm_engine.py), so the profile is its engine.
    args = AsyncEngineArgs(model=model, max_num_seqs=max_num_seqs, enforce_eager=True,
                           enable_prefix_caching=True, scheduling_policy="priority",
                           disable_log_stats=True, max_model_len=2048)
    return AsyncLLM.from_engine_args(args)


class _Ids:
    """Fresh random prompts, so prefix caching never shortens a measured prefill."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)
        self.n = 0

    def prompt(self, length: int) -> list[int]:
        return [int(t) for t in self.rng.integers(1000, 30000, length)]

    def rid(self) -> str:
        self.n += 1
        return f"profile-{self.n}"


async def _one(engine: Any, ids: _Ids, length: int, out: int, t0: float) -> list[float]:
    """Seconds from t0 to each output token of one request."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(max_tokens=out, min_tokens=out, ignore_eos=True, temperature=0.0,
                            output_kind=RequestOutputKind.DELTA)
    stamps = []
    async for out_ in engine.generate(TokensPrompt(prompt_token_ids=ids.prompt(length)), params,
                                      ids.rid()):
        stamps += [time.perf_counter() - t0] * max(len(out_.outputs[0].token_ids), 1)
    return stamps


def step_seconds(runs: list[list[float]]) -> float:
    """Median step time while all requests of a batch decode together: between the last
    one's first token and the first one's last token, from each request's token times."""
    lo, hi = max(r[0] for r in runs), min(r[-1] for r in runs)
    steps = []
    for stamps in runs:
        inside = [t for t in stamps if lo <= t <= hi]
        if len(inside) >= 3:
            steps.append((inside[-1] - inside[0]) / (len(inside) - 1))
    if not steps:  # no overlap long enough: fall back on the slowest request's mean step
        return max((r[-1] - r[0]) / max(len(r) - 1, 1) for r in runs)
    return float(statistics.median(steps))


async def _one_http(client: Any, base: str, model: str, ids: _Ids, length: int, out: int,
                    t0: float) -> list[float]:
    """_one through a server's /v1/completions (token-id prompt, forced length)."""
    import msgspec

    body = {"model": model, "prompt": ids.prompt(length), "max_tokens": out, "min_tokens": out,
            "ignore_eos": True, "temperature": 0.0, "stream": True}
    stamps: list[float] = []
    async with client.stream("POST", f"{base}/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            data = line.removeprefix("data:").strip()
            if not line.startswith("data:") or data == "[DONE]":
                continue
            if any(c.get("text") for c in msgspec.json.decode(data).get("choices") or []):
                stamps.append(time.perf_counter() - t0)
    return stamps


OneRequest = Callable[[_Ids, int, int, float], Awaitable[list[float]]]


async def _measure(one: OneRequest, args: argparse.Namespace, bar: Any) -> list[Point]:
    ids, points = _Ids(), []
    await one(ids, 8, 4, time.perf_counter())  # warm-up, not measured
    for length in args.prefill_lengths:
        times = [(await one(ids, length, 1, time.perf_counter()))[0]
                 for _ in range(args.repeats)]
        points.append(Point(kind="prefill", batch=1, input_tokens=length,
                            context_tokens=length, seconds=statistics.median(times)))
        bar.update(1)
    steps = args.decode_steps
    for batch in args.batches:
        for length in args.context_lengths:
            samples = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                runs = await asyncio.gather(*(one(ids, length, steps, t0)
                                              for _ in range(batch)))
                samples.append(step_seconds(list(runs)))
            points.append(Point(kind="decode", batch=batch, input_tokens=length,
                                context_tokens=batch * (length + steps // 2),
                                seconds=statistics.median(samples)))
            bar.update(1)
    return points


async def _profile(args: argparse.Namespace) -> tuple[list[Point], CpuShare | None]:
    """The points, and who used the CPU meanwhile (None through a server: its processes are
    not ours to tell from the rest)."""
    from tqdm import tqdm

    total = len(args.prefill_lengths) + len(args.batches) * len(args.context_lengths)
    with tqdm(total=total, desc="profile", unit="pt") as bar:
        if args.through:
            import httpx

            from bench.client import served_model

            async with httpx.AsyncClient(timeout=600) as client:
                model = await served_model(client, args.through)
                return await _measure(partial(_one_http, client, args.through, model), args,
                                      bar), None
        engine = _engine(str(args.model), max(args.batches), args.kv_gib)
        try:
            meter = CpuMeter(os.getpid())  # engine processes are our children
            points = await _measure(partial(_one, engine), args, bar)
            return points, meter.stop()  # before shutdown: exited processes are not counted
        finally:
            engine.shutdown()


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lengthwise profile", description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, help="HF model folder (required unless --learned)")
    p.add_argument("--out", type=Path, required=True, help="profile JSON to write")
    p.add_argument("--name", default="", help="profile name (default: the model folder)")
    p.add_argument("--prefill-lengths", type=_ints, default=_ints("16,128,256,512,1024,1536"))
    p.add_argument("--batches", type=_ints, default=_ints("1,2,4"))
    p.add_argument("--context-lengths", type=_ints, default=_ints("32,512,1024"))
    p.add_argument("--decode-steps", type=int, default=48, help="forced tokens per request")
    p.add_argument("--repeats", type=int, default=3, help="median of this many runs")
    p.add_argument("--kv-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE")
    p.add_argument("--learned", default="", metavar="URL",
                   help="write what the daemon at URL learned of its engines' step times "
                        "(its /metrics) instead of measuring: the simulator runs on it")
    p.add_argument("--through", default="", metavar="URL",
                   help="measure through a running server (the whole serving stack: HTTP, "
                        "daemon, streaming, the engine sharing the CPU) instead of the bare "
                        "engine; its max_num_seqs must be >= the largest batch")
    return p


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.learned:  # a snapshot of what a running daemon's clock learned: no measuring
        from bench.learned import fetch

        save(fetch(args.learned, args.name or "learned"), args.out)
        print(toml_section(args.out))
        return 0
    if args.model is None:
        parser.error("--model is required (or --learned URL)")
    points, cpu = asyncio.run(_profile(args))
    if cpu is not None:
        print(cpu.describe())
        cpu.warn_if_contaminated("while profiling")
    sim, report, fitted = fit_points(points)
    what = (f"through the server at {args.through} (whole stack)" if args.through
            else f"vLLM CPU engine, max_num_seqs={max(args.batches)}, enforce_eager")
    source = (f"measured by `lengthwise profile` on {platform.node()} "
              f"({os.cpu_count()} CPUs, {platform.machine()}), {what}, bf16 weights as shipped")
    profile = Profile(name=args.name or args.model.name, source=source,
                      max_num_seqs=max(args.batches), sim=sim, fit=report, points=fitted)
    save(profile, args.out)
    print(f"prefill fit: mean |err| {report.prefill_mape:.1%}, max {report.prefill_max_error:.1%}")
    print(f"decode fit:  mean |err| {report.decode_mape:.1%}, max {report.decode_max_error:.1%}")
    print(toml_section(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
