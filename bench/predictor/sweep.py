"""Dev sweep of proxy objectives: featurise once, fit each config with the same `fit` as
`predictor train --kind proxy` (deterministic, so the CLI reproduces every row).

    python -m bench.predictor.sweep out/data/sharegpt_train.jsonl \\
        '[{}, {"rank_weight": 1.0, "rank_loss": "listnet"}, {"quantiles": []}]'

Each config is TrainConfig fields plus "quantiles" (default 0.1, 0.5, 0.9); one JSON line per
config with the dev metrics (all dev turns)."""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import torch

from predictor.dataset import lengths, load_train_dev
from predictor.evaluate import quality, quintiles
from predictor.features import NUMERIC_NAMES, BagTokenizer, featurize
from predictor.manifest import NetConfig
from predictor.proxy import quantile_metrics
from predictor.records import is_first_turn
from predictor.trainer import TrainConfig, all_outputs, calibration, fit, scores


def main(data_path: str, configs: list[dict]) -> None:
    torch.set_num_threads(1)
    data = load_train_dev(data_path, 0, 0)
    bagger = BagTokenizer("minilm")
    train = featurize(bagger, [r.messages for r in data.train])
    dev = featurize(bagger, [r.messages for r in data.dev])
    y, dev_y = lengths(data.train), lengths(data.dev)
    bounds = quintiles(y)
    first = np.asarray([is_first_turn(r) for r in data.dev])
    for config in configs:
        levels = tuple(config.pop("quantiles", (0.1, 0.5, 0.9)))
        cfg = NetConfig(table_size=bagger.table_size, num_numeric=len(NUMERIC_NAMES),
                        bag_dim=16, hidden=256, quantiles=levels)
        started = time.perf_counter()
        net = fit(cfg, train, np.log1p(y), TrainConfig(**config))
        cal = calibration(scores(net, train), y)
        out = all_outputs(net, dev).astype(np.float64)
        pred = np.maximum(cal * np.expm1(out[:, 0]), 1.0)
        row = quality(pred, dev_y, bounds) | quantile_metrics(out, levels, dev_y)
        row["first_kendall_tau"] = quality(pred[first], dev_y[first], bounds)["kendall_tau"]
        print(json.dumps({"config": config, "quantiles": levels,
                          "seconds": round(time.perf_counter() - started), **row}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
