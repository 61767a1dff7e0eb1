"""`predictor windows --model ITERATIVE --data FILE`: per-window re-prediction quality."""

from __future__ import annotations

import argparse
import hashlib
import json

from predictor.iterative import markdown, window_report
from predictor.loader import default_predictor_path, load_predictor
from predictor.manifest import read_manifest
from predictor.records import Record, read_records


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="trained iterative predictor folder")
    p.add_argument("--data", required=True, help="JSONL records to score")
    p.add_argument("--baseline", default="",
                   help="first-estimate predictor for 'first prediction minus tokens so far' "
                        "('' = the shipped proxy, 'none' = skip)")
    p.add_argument("--tokenizer", default="models/smollm2-135m-instruct",
                   help="serving model folder: answers are cut at its K-token windows")
    p.add_argument("--max-windows", type=int, default=10, help="windows 0..N")
    p.add_argument("--dev", action="store_true",
                   help="score only the dev hold-out of the training side (for choices)")
    p.add_argument("--limit", type=int, default=0,
                   help="a fixed subset of N records (chosen by id hash; 0: all)")
    p.add_argument("--json", action="store_true", help="print one JSON object only")
    p.add_argument("--threads", type=int, default=1, help="torch threads")


def _records(args: argparse.Namespace) -> list[Record]:
    if args.dev:
        from predictor.dataset import load_train_dev
        return load_train_dev(args.data, limit=1, dev_limit=args.limit).dev
    records = list(read_records(args.data))
    if args.limit:
        records.sort(key=lambda r: hashlib.sha256(r.id.encode()).hexdigest())
        records = records[:args.limit]
    return records


def run(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(args.threads)
    model = load_predictor(args.model)
    baseline = None if args.baseline == "none" else load_predictor(
        args.baseline or default_predictor_path())
    manifest = read_manifest(model.path)
    report = window_report(model, baseline, _records(args), args.tokenizer, args.max_windows,
                           manifest.window, manifest.quintiles)
    if args.json:
        print(json.dumps(report))
        return 0
    for scope in ("all", "first"):
        print(f"\n{scope} turns ({report['records']:,} records)\n{markdown(report, scope)}")
    return 0
