"""`lengthwise bench run|compare|sweep|frontier`; also `python -m bench.cli run|compare ...`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench import client, workload


def _run_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("run", help="drive one OpenAI-compatible server, print metrics")
    p.add_argument("--target", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default="", help="model name to send (default: the server's)")
    p.add_argument("--priority", choices=("none", "length"), default="none",
                   help="length: send the true output length as the request priority")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--requests-out", type=Path, help="write per-request results (JSONL)")
    client.add_arguments(p)
    workload.add_arguments(p)
    p.set_defaults(func=_cmd_run)


def _cmd_run(args: argparse.Namespace) -> int:
    import msgspec

    from bench import metrics

    spec = workload.spec_from_args(args)
    workload.warn_sample(spec)
    requests = workload.build(spec)
    opts = client.ClientOptions(model=args.model, natural=args.natural,
                                priority=args.priority, max_model_len=args.max_model_len)
    results = client.run(args.target, requests, opts, progress=not args.json)
    summary = metrics.summarize(results, args.slo_ttft, args.slo_tpot)
    if args.requests_out:
        args.requests_out.write_bytes(b"\n".join(msgspec.json.encode(r) for r in results))
    if args.json:
        print(metrics.to_json(summary, {"sample": workload.sample_label(spec)}))
    else:
        for key, value in msgspec.structs.asdict(summary).items():
            print(f"{key:>16}: {value:.4g}" if isinstance(value, float) else
                  f"{key:>16}: {value}")
        for r in results:
            if not r.ok:
                print(f"request {r.index} failed: {r.error}", file=sys.stderr)
                break
    return 0 if summary.n_completed else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="lengthwise bench",
                                     description="benchmarks against OpenAI-compatible servers")
    sub = parser.add_subparsers(dest="command", required=True)
    _run_parser(sub)
    from bench.compare import add_parser as add_compare
    from bench.fleet.cli import add_parser as add_fleet
    from bench.frontier.cli import add_parser as add_frontier
    from bench.sweep import add_parser as add_sweep

    add_compare(sub)
    add_sweep(sub)
    add_frontier(sub)
    add_fleet(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
