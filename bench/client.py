"""Open-loop HTTP load client for any OpenAI-compatible server (streaming chat completions).

Requests go out at their scheduled arrival times whatever the server does (open loop), so a
slow server builds a queue as it would in production. JCT and TTFT count from the scheduled
arrival, so time a request spends stuck in the client also counts against the server.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from collections.abc import Sequence
from typing import Any

import httpx
import msgspec

from bench.metrics import RequestResult
from bench.workload import Request
from daemon.core.job import Slo


class ClientOptions(msgspec.Struct, frozen=True, kw_only=True):
    model: str = ""  # "" = the first model the server lists
    natural: bool = False  # let the model stop by itself instead of forcing the length
    # "length": send the true output length as `priority` (vLLM's priority scheduler then
    # runs shortest-first: an oracle length hint); "none": every request priority 0.
    priority: str = "none"
    max_model_len: int = 2048
    temperature: float = 0.0
    request_timeout_s: float = 600.0
    # Put in front of every first message. `bench compare` gives each run its own, so a run
    # never finds the previous run's prompts in the server's prefix cache (same prompts,
    # new rate): every rate pays its prefills as a fresh server would.
    salt: str = ""
    headers: dict[str, str] = {}  # sent with every request (llm-d's SLO headers: --send-slo)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The client flags `bench run` and `bench compare` share."""
    p.add_argument("--natural", action="store_true",
                   help="let the model stop by itself (default: force each output length)")
    p.add_argument("--slo-ttft", type=float, default=None, help="goodput SLO on TTFT, s")
    p.add_argument("--slo-tpot", type=float, default=None, help="goodput SLO on TPOT, s")
    p.add_argument("--send-slo", action="store_true",
                   help="send --slo-ttft / --slo-tpot with every request as llm-d's headers "
                        "(x-llm-d-slo-ttft-ms, x-llm-d-slo-tpot-ms), to every system")
    p.add_argument("--send-slo-except", default="", metavar="SYSTEMS",
                   help="with --send-slo, the systems (comma-separated, as in --systems) "
                        "that get no headers: one system with and without objectives on the "
                        "same draws (a no-op override, e.g. +slo.enforce=true, names the twin)")


def sent_slo(args: argparse.Namespace) -> Slo | None:
    """The objective --send-slo gives every request (the headers' values); None without."""
    if not getattr(args, "send_slo", False):
        return None
    return Slo(ttft_s=args.slo_ttft, tpot_s=args.slo_tpot)


def slo_exempt(args: argparse.Namespace) -> list[str]:
    """The systems --send-slo-except names (their specs)."""
    return [spec.strip() for spec in getattr(args, "send_slo_except", "").split(",")
            if spec.strip()]


def slo_headers(args: argparse.Namespace, system: str = "") -> dict[str, str]:
    """llm-d's SLO headers for --send-slo; {} without it, or for a `system` it exempts."""
    slo = sent_slo(args)
    if slo is None or system in slo_exempt(args):
        return {}
    pairs = (("x-llm-d-slo-ttft-ms", slo.ttft_s), ("x-llm-d-slo-tpot-ms", slo.tpot_s))
    return {name: f"{value * 1000:g}" for name, value in pairs if value is not None}


def request_body(req: Request, opts: ClientOptions, model: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": m.role, "content": (opts.salt if k == 0 else "") + m.content}
                     for k, m in enumerate(req.messages)],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": opts.temperature,
    }
    if opts.natural:
        body["max_tokens"] = max(opts.max_model_len - req.prompt_tokens - 1, 1)
    else:
        # ignore_eos alone lets generation-config stop ids end it early; min_tokens does not.
        body.update(max_tokens=req.output_tokens, min_tokens=req.output_tokens, ignore_eos=True)
    if opts.priority == "length":
        body["priority"] = req.output_tokens
    return body


async def served_model(client: httpx.AsyncClient, base: str) -> str:
    resp = await client.get(f"{base}/v1/models")
    resp.raise_for_status()
    return str(resp.json()["data"][0]["id"])


async def _one(client: httpx.AsyncClient, base: str, req: Request, opts: ClientOptions,
               model: str, t0: float) -> RequestResult:
    await asyncio.sleep(max(t0 + req.arrival_s - time.perf_counter(), 0.0))
    arrival = t0 + req.arrival_s
    first, last, chunks, usage = math.nan, math.nan, 0, None
    try:
        async with client.stream("POST", f"{base}/v1/chat/completions",
                                 json=request_body(req, opts, model),
                                 headers=opts.headers) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")[:200]
                return _failed(req, f"HTTP {resp.status_code}: {text}",
                               time.perf_counter() - arrival)
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = msgspec.json.decode(data)
                for choice in event.get("choices") or []:
                    if (choice.get("delta") or {}).get("content"):
                        now = time.perf_counter()
                        first = now if math.isnan(first) else first
                        last, chunks = now, chunks + 1
                usage = event.get("usage") or usage
    except (httpx.HTTPError, msgspec.DecodeError) as exc:
        return _failed(req, f"{type(exc).__name__}: {exc}")
    tokens = int(usage["completion_tokens"]) if usage else chunks
    if math.isnan(first):
        return _failed(req, "no output tokens")
    return RequestResult(index=req.index, arrival_s=req.arrival_s,
                         prompt_tokens=req.prompt_tokens, output_tokens=tokens, ok=True,
                         ttft_s=first - arrival, jct_s=last - arrival)


def _failed(req: Request, error: str, after_s: float = math.nan) -> RequestResult:
    """A request that got no answer; `after_s`: when its error response came (jct_s)."""
    return RequestResult(index=req.index, arrival_s=req.arrival_s,
                         prompt_tokens=req.prompt_tokens, output_tokens=0, ok=False, error=error,
                         jct_s=after_s)


async def run_requests(base_url: str, requests: Sequence[Request], opts: ClientOptions,
                       progress: bool = True) -> list[RequestResult]:
    """Send every request at its arrival time; results in request order."""
    from tqdm import tqdm

    base = base_url.rstrip("/")
    base = base.removesuffix("/v1")
    # Idle connections expire well before the servers' own 5 s keep-alive (hypercorn,
    # uvicorn): reusing one the server is closing at that instant fails with ReadError.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None,
                          keepalive_expiry=1.0)
    timeout = httpx.Timeout(opts.request_timeout_s, connect=30.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        model = opts.model or await served_model(client, base)
        t0 = time.perf_counter() + 0.05  # a head start to create every task
        tasks = [asyncio.create_task(_one(client, base, r, opts, model, t0)) for r in requests]
        with tqdm(total=len(tasks), unit="req", disable=not progress, leave=False) as bar:
            for fut in asyncio.as_completed(tasks):
                await fut
                bar.update(1)
        return [t.result() for t in tasks]


def run(base_url: str, requests: Sequence[Request], opts: ClientOptions,
        progress: bool = True) -> list[RequestResult]:
    return asyncio.run(run_requests(base_url, requests, opts, progress))
