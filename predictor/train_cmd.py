"""`predictor train --kind proxy|retrieval|iterative --data FILE --out DIR`."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from predictor.dataset import load_train_dev
from predictor.proxy import ProxyOptions, train_proxy
from predictor.trainer import TrainConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--tokenizer", default="models/smollm2-135m-instruct",
                   help="iterative: serving model folder, to cut answers at K-token windows")
    p.add_argument("--threads", type=int, default=1, help="torch threads (CPU is shared)")


def _levels(text: str) -> tuple[float, ...]:
    levels = tuple(sorted(float(v) for v in text.split(",") if v.strip()))
    if any(not 0.0 < q < 1.0 for q in levels):
        raise argparse.ArgumentTypeError(f"quantile levels must be in (0, 1): {text!r}")
    return levels


def run(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false" if args.threads == 1 else "true")
    data = load_train_dev(args.data, args.limit, args.dev_limit)
    print(f"train {len(data.train)} records, dev {len(data.dev)}")
    rank_weight = args.rank_weight
    if rank_weight is None:
        rank_weight = 0.0 if args.kind == "iterative" else 1.0
    tc = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                     rank_weight=rank_weight, rank_loss=args.rank_loss,
                     rank_temperature=args.rank_temperature,
                     quantile_weight=args.quantile_weight, seed=args.seed)
    opts = ProxyOptions(encoder=args.encoder, use_encoder=args.use_encoder,
                        encoder_max_tokens=args.encoder_max_tokens,
                        cache_dir=Path(args.cache_dir) if args.cache_dir else None,
                        quantiles=args.quantiles, members=args.members)
    out = Path(args.out)
    if args.kind == "proxy":
        manifest = train_proxy(data, opts, tc, out)
    elif args.kind == "retrieval":
        from predictor.retrieval import train_retrieval
        manifest = train_retrieval(data, opts, tc, out, args.fallback)
    else:
        from predictor.iterative import train_iterative
        manifest = train_iterative(data, opts, tc, out, args.window, args.max_windows,
                                   args.tokenizer)
    print(json.dumps({"kind": manifest.kind, "train_seconds": round(manifest.train_seconds, 1),
                      "dev": manifest.dev_metrics}, indent=1))
    return 0
