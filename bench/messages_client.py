"""A closed-loop streaming client for Anthropic's Messages API (`POST /v1/messages`), for
`python -m bench.frontcpu --routes messages`: vLLM's bench client has no Messages backend.
It keeps `--streams` streams open, each answer `--tokens` long (max_tokens; the random tiny
model writes to the cap), and saves what vLLM's bench client saves that frontcpu reads
(completed, failed, total_output_tokens, output_throughput).

    python -m bench.messages_client --base-url URL --model NAME --requests 256 \
        --streams 64 --tokens 256 --result FILE
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import httpx


async def _one(client: httpx.AsyncClient, model: str, k: int, tokens: int) -> int:
    """One streamed answer's output tokens (message_delta's usage)."""
    body = {"model": model, "max_tokens": tokens, "temperature": 0.0, "stream": True,
            "messages": [{"role": "user",
                          "content": f"Request {k}: write a long story about a lighthouse."}]}
    out = -1
    async with client.stream("POST", "/v1/messages", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and '"message_delta"' in line:
                out = int(json.loads(line[6:])["usage"]["output_tokens"])
    if out < 0:
        raise RuntimeError("the stream ended without message_delta")
    return out


async def run(base_url: str, model: str, requests: int, streams: int, tokens: int
              ) -> dict[str, float]:
    queue = list(range(requests))
    done, failed = [], 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal failed
        while queue:
            k = queue.pop()
            try:
                done.append(await _one(client, model, k, tokens))
            except (httpx.HTTPError, RuntimeError, ValueError):
                failed += 1

    limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
    start = time.monotonic()
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(streams)))
    wall = time.monotonic() - start
    return {"completed": len(done), "failed": failed, "total_output_tokens": sum(done),
            "output_throughput": sum(done) / wall, "duration": wall}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.messages_client",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--result", type=Path, required=True)
    args = p.parse_args(argv)
    saved = asyncio.run(run(args.base_url, args.model, args.requests, args.streams,
                            args.tokens))
    args.result.write_text(json.dumps(saved))
    print(json.dumps(saved))
    return 0 if saved["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
