"""`lengthwise chaos --target URL`: operational probes against a running daemon on this host,
with a table of figures.

  malformed  the bad-input corpus (bench/malformed.py): statuses, 5xx count
  kill       N streams, then kill -9 of the daemon's vLLM EngineCore: time to /health 503,
             to 200 again, streams finished whole, streams lost
  overload   C concurrent short requests, several cycles: connection errors, 429s with and
             without Retry-After, the daemon's RSS growth across cycles

`kill` and the RSS figure need the daemon on this host (found by the port it listens on).
Traffic goes to the target only.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import time
from urllib.parse import urlparse

import httpx
import psutil

from bench.malformed import corpus


def _daemon_process(target: str) -> psutil.Process:
    port = urlparse(target).port
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return psutil.Process(conn.pid)
    raise SystemExit(f"no process on this host listens on port {port}")


def _engine_core(daemon: psutil.Process) -> psutil.Process:
    for child in daemon.children(recursive=True):
        if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline()):
            return child
    raise SystemExit("the daemon has no EngineCore child (engine.kind = sim?)")


async def malformed(client: httpx.AsyncClient, model: str) -> dict[str, float]:
    counts: collections.Counter[str] = collections.Counter()
    for case in corpus(model):
        response = await client.post(case.path, content=case.body,
                                     headers={"content-type": "application/json"})
        counts[f"{response.status_code // 100}xx"] += 1
        counts["as expected"] += response.status_code == case.status
    return {"requests": len(corpus(model)), "4xx": counts["4xx"], "5xx": counts["5xx"],
            "status as expected": counts["as expected"]}


async def _stream(client: httpx.AsyncClient, model: str, max_tokens: int,
                  started: asyncio.Event) -> int | None:
    """Completion tokens of one forced-length stream; None if it ended with an error."""
    body = {"model": model, "messages": [{"role": "user", "content": "Tell me a story."}],
            "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    usage = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            started.set()
            event = json.loads(line.removeprefix("data: "))
            if "error" in event:
                return None
            usage = event.get("usage") or usage
    return None if usage is None else int(usage["completion_tokens"])


async def _health_until(client: httpx.AsyncClient, status: int, since: float,
                        timeout_s: float) -> float | None:
    deadline = since + timeout_s
    while time.monotonic() < deadline:
        if (await client.get("/health")).status_code == status:
            return time.monotonic() - since
        await asyncio.sleep(0.05)
    return None


async def kill(client: httpx.AsyncClient, target: str, model: str, streams: int,
               max_tokens: int) -> dict[str, float]:
    events = [asyncio.Event() for _ in range(streams)]
    tasks = [asyncio.create_task(_stream(client, model, max_tokens, e)) for e in events]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 300)
    _engine_core(_daemon_process(target)).kill()
    killed = time.monotonic()
    down = await _health_until(client, 503, killed, 30)
    up = await _health_until(client, 200, killed, 600)
    tokens = await asyncio.gather(*tasks)
    whole = sum(t == max_tokens for t in tokens)
    return {"streams": streams, "s to /health 503": down or -1, "s to /health 200": up or -1,
            "s to last stream done": time.monotonic() - killed,
            "streams finished whole": whole, "streams lost": streams - whole}


async def _burst(client: httpx.AsyncClient, model: str, concurrency: int
                 ) -> collections.Counter[str]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "ignore_eos": True}
    out: collections.Counter[str] = collections.Counter()

    async def one() -> None:
        try:
            response = await client.post("/v1/chat/completions", json=body)
        except httpx.TransportError:
            out["connection errors"] += 1
            return
        out[str(response.status_code)] += 1
        out["429 without Retry-After"] += (response.status_code == 429
                                           and "retry-after" not in response.headers)

    await asyncio.gather(*(one() for _ in range(concurrency)))
    return out


async def overload(client: httpx.AsyncClient, target: str, model: str, concurrency: int,
                   cycles: int) -> dict[str, float]:
    daemon = _daemon_process(target)
    totals: collections.Counter[str] = collections.Counter()
    rss = []
    for _ in range(cycles):
        totals.update(await _burst(client, model, concurrency))
        rss.append(daemon.memory_info().rss)
    return {"requests": concurrency * cycles, "200": totals["200"], "429": totals["429"],
            "429 without Retry-After": totals["429 without Retry-After"],
            "5xx": sum(v for k, v in totals.items() if k.startswith("5")),
            "connection errors": totals["connection errors"],
            "RSS growth % (first to last cycle)": 100.0 * (rss[-1] - rss[0]) / rss[0]}


async def _run(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    headers = {"authorization": f"Bearer {args.key}"} if args.key else {}
    limits = httpx.Limits(max_connections=max(args.concurrency, args.streams) + 8,
                          max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=args.target, headers=headers, timeout=600,
                                 limits=limits) as client:
        model = args.model or (await client.get("/v1/models")).json()["data"][0]["id"]
        results = {}
        for probe in args.probes.split(","):
            if probe == "malformed":
                results[probe] = await malformed(client, model)
            elif probe == "kill":
                results[probe] = await kill(client, args.target, model, args.streams,
                                            args.max_tokens)
            elif probe == "overload":
                results[probe] = await overload(client, args.target, model, args.concurrency,
                                                args.cycles)
            else:
                raise SystemExit(f"unknown probe {probe!r}")
    return results


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="lengthwise chaos", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--probes", default="malformed,kill,overload")
    p.add_argument("--key", default="", help="API key, if the daemon has keys")
    p.add_argument("--model", default="", help="model name (default: the server's)")
    p.add_argument("--streams", type=int, default=8, help="kill: streams running at the kill")
    p.add_argument("--max-tokens", type=int, default=600, help="kill: tokens per stream")
    p.add_argument("--concurrency", type=int, default=500, help="overload: requests at once")
    p.add_argument("--cycles", type=int, default=3, help="overload: bursts, for RSS growth")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    results = asyncio.run(_run(args))
    if args.json:
        print(json.dumps(results))
        return 0
    for probe, figures in results.items():
        for name, value in figures.items():
            shown = f"{value:.1f}" if isinstance(value, float) else str(value)
            print(f"{probe:<10} {name:<36} {shown:>10}")
    return 0
