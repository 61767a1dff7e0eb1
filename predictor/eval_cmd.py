"""`predictor eval --model DIR --data FILE --json`."""

from __future__ import annotations

import argparse
import hashlib
import json

from predictor.evaluate import report
from predictor.loader import load_predictor
from predictor.manifest import read_manifest
from predictor.records import read_records


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="trained predictor folder")
    p.add_argument("--data", required=True, help="JSONL records to score")
    p.add_argument("--json", action="store_true", help="print one JSON object only")
    p.add_argument("--limit", type=int, default=0,
                   help="score a fixed subset of N records (chosen by id hash; 0: all)")
    p.add_argument("--online", action="store_true",
                   help="observe each batch's true lengths after predicting it (retrieval "
                        "learns online as in serving; the saved index is not touched)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")


def run(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(args.threads)
    records = list(read_records(args.data))
    if args.limit:
        records.sort(key=lambda r: hashlib.sha256(r.id.encode()).hexdigest())
        records = records[:args.limit]
    predictor = load_predictor(args.model)
    result = report(predictor, read_manifest(predictor.path), records, args.online)
    print(json.dumps(result, indent=None if args.json else 1))
    return 0
