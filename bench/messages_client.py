"""A closed-loop streaming client for Anthropic's Messages API (`POST /v1/messages`), for
`python -m bench.frontcpu --endpoints chat,messages`: vLLM's bench client has no Messages
backend. It reads the custom dataset frontcpu gives vLLM's client (JSON lines of `prompt`
and `output_tokens`), keeps `--streams` streams open, each answer `output_tokens` long
(max_tokens: the messages API has no ignore_eos; the random tiny model writes to the cap),
and saves what frontcpu reads of vLLM's client's result (completed, failed,
total_output_tokens, output_throughput).

    python -m bench.messages_client --base-url URL --model NAME --dataset FILE \
        --requests 256 --streams 64 --result FILE
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import httpx


async def _one(client: httpx.AsyncClient, model: str, prompt: str, tokens: int) -> int:
    """One streamed answer's output tokens (message_delta's usage)."""
    body = {"model": model, "max_tokens": tokens, "temperature": 0.0, "stream": True,
            "messages": [{"role": "user", "content": prompt}]}
    out = -1
    async with client.stream("POST", "/v1/messages", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and '"message_delta"' in line:
                out = int(json.loads(line[6:])["usage"]["output_tokens"])
    if out < 0:
        raise RuntimeError("the stream ended without message_delta")
    return out


async def run(base_url: str, model: str, requests: list[tuple[str, int]], streams: int
              ) -> dict[str, float]:
    queue = requests[::-1]
    done, failed = [], 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal failed
        while queue:
            prompt, tokens = queue.pop()
            try:
                done.append(await _one(client, model, prompt, tokens))
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
    p.add_argument("--dataset", type=Path, required=True,
                   help="JSON lines: prompt, output_tokens")
    p.add_argument("--requests", type=int, default=256, help="the dataset's first N")
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--result", type=Path, required=True)
    args = p.parse_args(argv)
    lines = args.dataset.read_text().splitlines()[:args.requests]
    requests = [(row["prompt"], int(row["output_tokens"])) for row in map(json.loads, lines)]
    saved = asyncio.run(run(args.base_url, args.model, requests, args.streams))
    args.result.write_text(json.dumps(saved))
    print(json.dumps(saved))
    return 0 if saved["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
