"""`lengthwise predictor data|train|eval|windows`; also runnable as `python -m predictor.cli ...`."""

from __future__ import annotations

import argparse
import os
import sys


def _parser() -> argparse.ArgumentParser:
    from predictor import data_cmd, eval_cmd, train_cmd, windows_cmd

    parser = argparse.ArgumentParser(prog="lengthwise predictor",
                                     description="output-length predictors: data, train, eval")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module, help_text in (
        ("data", data_cmd, "build JSONL records (reserved-split rule applied)"),
        ("train", train_cmd, "train a proxy, retrieval or iterative predictor"),
        ("eval", eval_cmd, "evaluate a trained predictor on a JSONL file"),
        ("windows", windows_cmd, "per-window quality of an iterative predictor"),
    ):
        sp = sub.add_parser(name, help=help_text)
        module.add_arguments(sp)
        sp.set_defaults(run=module.run)
    return parser


def main(argv: list[str]) -> int:
    # Weights are never fetched at run time; the encoder ships in a local package.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    args = _parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
