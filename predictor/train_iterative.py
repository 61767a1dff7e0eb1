"""Training the iterative predictor on every K-token prefix of each training answer."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import numpy as np

from predictor.dataset import TrainData, chars_per_token
from predictor.evaluate import quality
from predictor.features import (
    NUM_PARTIAL,
    NUMERIC_NAMES,
    BagTokenizer,
    FeatureRows,
    add_partials,
    featurize,
)
from predictor.manifest import Manifest, NetConfig, write_manifest
from predictor.net import save_net
from predictor.proxy import ProxyOptions, base_manifest
from predictor.records import Record
from predictor.trainer import TrainConfig, calibration, fit, scores
from predictor.windows import WindowExamples, window_examples


def window_rows(bagger: BagTokenizer, records: list[Record], ex: WindowExamples,
                cpt: float) -> FeatureRows:
    """Per-record features are computed once and shared (by reference) by its windows."""
    base = featurize(bagger, [r.messages for r in records])
    expanded = FeatureRows(prompt_bags=[base.prompt_bags[i] for i in ex.record],
                           hist_bags=[base.hist_bags[i] for i in ex.record],
                           numeric=base.numeric[ex.record])
    generated = [round(len(p) / cpt) for p in ex.partial]  # as at serving time
    return add_partials(bagger, expanded, ex.partial, generated)


def train_iterative(data: TrainData, opts: ProxyOptions, tc: TrainConfig, out: Path,
                    window: int, max_windows: int, tokenizer: str) -> Manifest:
    t0 = time.perf_counter()
    bagger = BagTokenizer(opts.encoder)
    cpt = chars_per_token(data.train)
    train_ex = window_examples(data.train, window, max_windows, tokenizer)
    dev_ex = window_examples(data.dev, window, max_windows, tokenizer)
    print(f"{len(train_ex.window)} training windows, {len(dev_ex.window)} dev windows")
    train_rows = window_rows(bagger, data.train, train_ex, cpt)
    dev_rows = window_rows(bagger, data.dev, dev_ex, cpt)
    cfg = NetConfig(table_size=bagger.table_size, num_numeric=len(NUMERIC_NAMES) + NUM_PARTIAL,
                    bag_dim=opts.bag_dim, hidden=opts.hidden, partial=True)
    net = fit(cfg, train_rows, np.log1p(train_ex.remaining), tc, desc="train iterative")
    manifest = base_manifest("iterative", data, opts, cfg, tc.seed)
    cal = calibration(scores(net, train_rows), train_ex.remaining)
    pred = np.maximum(cal * np.expm1(scores(net, dev_rows).astype(np.float64)), 1.0)
    dev = quality(pred, dev_ex.remaining, manifest.quintiles)
    first = np.asarray(dev_ex.window) == 0
    dev |= {f"window0_{k}": v for k, v in
            quality(pred[first], dev_ex.remaining[first], manifest.quintiles).items()}
    out.mkdir(parents=True, exist_ok=True)
    save_net(net, out)
    manifest = msgspec.structs.replace(manifest, calibration=cal, dev_metrics=dev, window=window,
                                       tokenizer=tokenizer,  # as given: a path on the training host
                                       train_seconds=time.perf_counter() - t0)
    write_manifest(out, manifest)
    return manifest
