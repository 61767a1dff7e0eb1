"""The serving process's own CPU per streamed token: lengthwise against vLLM's OpenAI server.

Both servers run the same engine (an EngineCore child process); what differs is the front
process: HTTP server, request handling, vLLM's output processing (detokenizing, which both
run in the front process) and, for lengthwise, its core. This starts each server in turn on
the same engine settings, drives it with vLLM's own bench client (chat backend, a fixed
number of concurrent streams, every answer forced to the same length) and reads the front
process's CPU seconds (the root of the server's process tree, not its engine children)
around the run. lengthwise runs on each HTTP server named by --http (`[server] http`:
uvicorn and hypercorn by default). Alternations repeat the systems in opposite orders; the
report is the median, and each system's ratio to the first (vLLM's server).
`--endpoints chat,responses` drives each started server on /v1/chat/completions and then on
/v1/responses (vLLM's client's openai-responses backend: typed events, `store: false`).

    python -m bench.frontcpu --out /tmp/frontcpu --alternations 3 [--py-spy]

With --py-spy the front process is sampled during the run and its samples are split by who
spent them (vLLM's output processing, the core, SSE encoding, the HTTP server, the event
loop), as the note's breakdown.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import msgspec
import psutil

from bench.hostload import CpuMeter
from bench.servers import Server, Settings, parse_system
from bench.vllm_client import served_model

# Who a sampled stack belongs to: the first rule whose marker is in the stack's frames,
# innermost first (so a msgspec encode called by the routes counts as SSE encoding).
BUCKETS = (
    ("vLLM output processing", ("vllm/v1/engine/output_processor", "vllm/v1/engine/detokenizer",
                                "vllm/v1/engine/logprobs", "tokenizers", "vllm/v1/engine/core_client",
                                "vllm/v1/engine/async_llm", "vllm/entrypoints/openai/serving",
                                "vllm/v1/engine/processor", "vllm/v1/engine/input_processor")),
    ("lengthwise core", ("daemon/core/", "policies/", "daemon/prediction", "daemon/executors/")),
    ("SSE / response encoding", ("daemon/http/routes", "daemon/http/translate",
                                 "daemon/http/schemas", "daemon/http/openai_responses",
                                 "daemon/http/responses_", "daemon/http/chat", "vllm/entrypoints/openai/",
                                 "pydantic", "msgspec")),
    ("HTTP server", ("hypercorn", "h11", "starlette", "uvicorn", "fastapi", "httptools")),
    # The loop itself: running it, polling, dispatching callbacks. asyncio's other modules
    # (streams, locks, queues) are no one's: a socket write under the HTTP server's send
    # is the HTTP server's.
    ("event loop / asyncio", ("asyncio/runners", "asyncio/base_events", "asyncio/events",
                              "uvloop", "selectors")),
)


# The endpoints a run can drive: (vLLM's bench client backend, path).
ENDPOINTS = {"chat": ("openai-chat", "/v1/chat/completions"),
             "responses": ("openai-responses", "/v1/responses")}


class Run(msgspec.Struct, frozen=True):
    system: str
    alternation: int
    output_tokens: int
    wall_s: float
    front_cpu_s: float
    engine_cpu_s: float
    other_cores: float
    output_tok_s: float
    completed: int
    failed: int
    endpoint: str = "chat"

    @property
    def front_us_per_token(self) -> float:
        return self.front_cpu_s / max(self.output_tokens, 1) * 1e6


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def _children_s(proc: psutil.Process) -> float:
    total = 0.0
    for child in proc.children(recursive=True):
        try:
            total += _cpu_s(child)
        except psutil.Error:
            continue
    return total


def _dataset(path: Path, requests: int, tokens: int) -> None:
    lines = [json.dumps({"prompt": f"Request {k}: write a long story about a lighthouse.",
                         "output_tokens": tokens}) for k in range(requests)]
    path.write_text("\n".join(lines) + "\n")


def _client(base_url: str, model: Path, dataset: Path, result: Path, requests: int,
            streams: int, endpoint: str = "chat") -> list[str]:
    backend, path = ENDPOINTS[endpoint]
    return [sys.executable, "-m", "bench.vllm_bench_serve",
            "--backend", backend, "--endpoint", path,
            "--base-url", base_url, "--model", served_model(base_url),
            "--tokenizer", str(model), "--dataset-name", "custom",
            "--dataset-path", str(dataset), "--custom-output-len", "-1",
            "--disable-shuffle", "--skip-chat-template", "--num-prompts", str(requests),
            "--max-concurrency", str(streams), "--request-rate", "inf", "--ignore-eos",
            "--temperature", "0", "--num-warmups", "0", "--disable-tqdm", "--save-result",
            "--result-dir", str(result.parent), "--result-filename", result.name]


def run_one(spec: str, settings: Settings, args: argparse.Namespace, k: int) -> list[Run]:
    """One start of `spec`: a measured run per endpoint."""
    work = args.out / f"{spec.replace(':', '-')}-{k}"
    work.mkdir(parents=True, exist_ok=True)
    server = Server(parse_system(spec), settings, work)
    try:
        server.wait_ready()
        return [_measure(spec, server, args, k, work, endpoint) for endpoint in args.endpoints]
    finally:
        server.stop()


def _measure(spec: str, server: Server, args: argparse.Namespace, k: int, work: Path,
             endpoint: str) -> Run:
    front = psutil.Process(server.proc.pid)
    warm, dataset = work / "warm.jsonl", work / "data.jsonl"
    _dataset(warm, args.streams, 16)
    _dataset(dataset, args.requests, args.tokens)
    with open(work / "client.log", "a") as log:  # warm-up: compile paths, fill caches
        subprocess.run(_client(server.base_url, args.model, warm, work / f"warm-{endpoint}.json",
                               args.streams, args.streams, endpoint), stdout=log,
                       stderr=subprocess.STDOUT, check=True)
    spy = None
    if args.py_spy:
        spy = subprocess.Popen(
            [str(Path(sys.executable).parent / "py-spy"), "record", "--pid",
             str(front.pid), "--format", "raw", "--rate", "200", "--nonblocking",
             "--output", str(work / _folded(endpoint))],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
    meter = CpuMeter(server.proc.pid)
    front0, engine0, t0 = _cpu_s(front), _children_s(front), time.monotonic()
    result = work / f"result-{endpoint}.json"
    with open(work / "client.log", "a") as log:
        subprocess.run(_client(server.base_url, args.model, dataset, result,
                               args.requests, args.streams, endpoint),
                       stdout=log, stderr=subprocess.STDOUT, check=True)
    wall = time.monotonic() - t0
    front_s, engine_s = _cpu_s(front) - front0, _children_s(front) - engine0
    share = meter.stop()
    if spy is not None:
        spy.send_signal(2)  # SIGINT: py-spy writes its file and exits
        spy.wait(timeout=60)
    saved = json.loads(result.read_text())
    return Run(system=spec, alternation=k, output_tokens=int(saved["total_output_tokens"]),
               wall_s=wall, front_cpu_s=front_s, engine_cpu_s=engine_s,
               other_cores=share.other_cores,
               output_tok_s=float(saved["output_throughput"]),
               completed=int(saved["completed"]), failed=int(saved.get("failed", 0)),
               endpoint=endpoint)


def _folded(endpoint: str) -> str:
    return "front.folded" if endpoint == "chat" else f"front-{endpoint}.folded"


def breakdown(folded: Path) -> dict[str, float]:
    """Share of the front process's samples by bucket (py-spy's raw, folded stacks)."""
    counts: Counter[str] = Counter()
    for line in folded.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = stack.split(";")[::-1]  # innermost first
        bucket = "other"
        for frame in frames:
            hit = next((name for name, marks in BUCKETS if any(m in frame for m in marks)), None)
            if hit is not None:
                bucket = hit
                break
        counts[bucket] += int(n)
    total = sum(counts.values()) or 1
    return {name: counts[name] / total for name, _ in (*BUCKETS, ("other", ()))}


def report(runs: list[Run], args: argparse.Namespace) -> None:
    print(f"\nfront CPU per streamed token ({args.streams} streams x {args.tokens} tokens, "
          f"{args.requests} requests, max_num_seqs {args.max_num_seqs}, {args.model.name}):")
    width = max(len(spec) for spec in args.systems)
    print(f"{'system':<{width}} {'endpoint':<10} {'us/token median':>16} {'(min-max)':>16}"
          f" {'out tok/s median':>17} {'engine cores':>13} {'other cores':>12}")
    medians: dict[tuple[str, str], tuple[float, float]] = {}
    for endpoint in args.endpoints:
        for spec in args.systems:
            mine = [r for r in runs if r.system == spec and r.endpoint == endpoint]
            us = [r.front_us_per_token for r in mine]
            tps = [r.output_tok_s for r in mine]
            medians[spec, endpoint] = (statistics.median(us), statistics.median(tps))
            print(f"{spec:<{width}} {endpoint:<10} {medians[spec, endpoint][0]:>16.1f}"
                  f" {f'({min(us):.1f}-{max(us):.1f})':>16}"
                  f" {medians[spec, endpoint][1]:>17.0f}"
                  f" {statistics.median(r.engine_cpu_s / r.wall_s for r in mine):>13.2f}"
                  f" {max(r.other_cores for r in mine):>12.2f}")
    first, *others = args.systems
    for endpoint in args.endpoints:
        us_a, tps_a = medians[first, endpoint]
        for other in others:
            us_b, tps_b = medians[other, endpoint]
            print(f"{endpoint}: {other} / {first}: CPU per token {us_b / us_a:.2f}x, "
                  f"output tokens/s {tps_b / tps_a:.2f}x")
    if args.py_spy:
        _report_parts(args, medians)


def _report_parts(args: argparse.Namespace,
                  medians: dict[tuple[str, str], tuple[float, float]]) -> None:
    for endpoint in args.endpoints:
        for spec in args.systems:
            shares: dict[str, list[float]] = {}
            for k in range(args.alternations):
                folded = args.out / f"{spec.replace(':', '-')}-{k}" / _folded(endpoint)
                if folded.exists():
                    for name, share in breakdown(folded).items():
                        shares.setdefault(name, []).append(share)
            if shares:
                us = medians[spec, endpoint][0]
                parts = ", ".join(f"{name} {statistics.median(v) * us:.1f} us"
                                  for name, v in shares.items())
                print(f"{spec} {endpoint} front CPU by part (samples' share x median "
                      f"us/token): {parts}")


def with_servers(systems: list[str], servers: list[str]) -> list[str]:
    """Each lengthwise system once per HTTP server (`+server.http=NAME`); others as given."""
    out: list[str] = []
    for spec in systems:
        if parse_system(spec).kind == "lengthwise":
            out += [f"{spec}+server.http={http}" for http in servers]
        else:
            out.append(spec)
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.frontcpu", description=__doc__.split(
        "\n\n")[0])
    p.add_argument("--model", type=Path, default=Path("models/tiny-llama"))
    p.add_argument("--systems", default="vllm,lengthwise:fcfs",
                   help="comma list (bench compare's names); the first is the reference")
    p.add_argument("--http", default="uvicorn,hypercorn",
                   help="comma list of lengthwise's HTTP servers ([server] http): each "
                        "lengthwise system runs on each")
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--streams", type=int, default=64, help="concurrent streams")
    p.add_argument("--tokens", type=int, default=256, help="forced answer length")
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--alternations", type=int, default=3)
    p.add_argument("--endpoints", default="chat",
                   help=f"comma list of {', '.join(ENDPOINTS)}: each is driven on every "
                        "started server")
    p.add_argument("--py-spy", action="store_true", help="sample the front process")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    args.systems = with_servers(args.systems.split(","), args.http.split(","))
    args.endpoints = args.endpoints.split(",")
    if unknown := set(args.endpoints) - set(ENDPOINTS):
        p.error(f"unknown endpoints {sorted(unknown)}")
    settings = Settings(model=args.model, max_num_seqs=args.max_num_seqs, trust_budget=False)
    runs: list[Run] = []
    for k in range(args.alternations):
        order = args.systems if k % 2 == 0 else args.systems[::-1]
        for spec in order:
            for run in run_one(spec, settings, args, k):
                runs.append(run)
                print(f"[{k}] {spec} {run.endpoint}: {run.front_us_per_token:.1f} us/token, "
                      f"{run.output_tok_s:.0f} tok/s, {run.completed} ok, {run.failed} "
                      f"failed, other cores {run.other_cores:.2f}", flush=True)
    (args.out / "runs.json").write_bytes(msgspec.json.encode(runs))
    report(runs, args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
