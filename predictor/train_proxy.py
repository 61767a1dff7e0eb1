"""Training the proxy predictor: featurise, (embed), fit, calibrate, measure on dev, save."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
from tqdm import tqdm

from predictor.dataset import TrainData, chars_per_token, lengths
from predictor.evaluate import coverage, linear_fit, quality, quintiles
from predictor.features import (
    NUMERIC_NAMES,
    BagTokenizer,
    FeatureRows,
    TextEncoder,
    attach_embeddings,
    featurize,
)
from predictor.manifest import Manifest, NetConfig, write_manifest
from predictor.net import save_net
from predictor.quantiles import conformal_offsets, quantile_tokens, shifted
from predictor.records import Record, is_first_turn, render
from predictor.trainer import TrainConfig, all_outputs, calibration, fit_members, scores


def quantile_metrics(outputs: np.ndarray, levels: tuple[float, ...], true: np.ndarray
                     ) -> dict[str, float]:
    """Coverage of the predicted p50 and p90 (share of true lengths at or under them)."""
    if not levels or not (min(levels) <= 0.5 and max(levels) >= 0.9):
        return {}
    q = quantile_tokens(outputs, levels, (0.5, 0.9))
    return {"coverage_p50": coverage(q[:, 0], true), "coverage_p90": coverage(q[:, 1], true)}


@dataclass(slots=True)
class ProxyOptions:
    encoder: str = "minilm"
    use_encoder: bool = False  # frozen transformer embedding as an extra input (slow on CPU)
    encoder_max_tokens: int = 512
    cache_dir: Path | None = None
    bag_dim: int = 16  # 16 matched 32 on dev and halves the shipped file
    hidden: int = 256
    quantiles: tuple[float, ...] = (0.1, 0.5, 0.9)  # levels of the quantile head; () = none
    members: int = 1  # nets averaged (seeds seed, seed + 1, ...)


def rendered(records: list[Record]) -> list[str]:
    return [render(r.messages) for r in records]


def build_rows(records, bagger: BagTokenizer, opts: ProxyOptions,
               encoder: TextEncoder | None, desc: str) -> FeatureRows:
    rows = featurize(bagger, [r.messages for r in records])
    if encoder is not None:
        with tqdm(total=len(records), desc=f"embed {desc}", unit="rec", mininterval=5) as bar:
            cache = opts.cache_dir / f"{Path(opts.encoder).name}-{opts.encoder_max_tokens}" \
                if opts.cache_dir else None
            attach_embeddings(rows, rendered(records), encoder, cache, progress=bar)
    return rows


def base_manifest(kind: str, data: TrainData, opts: ProxyOptions, net: NetConfig, seed: int
                  ) -> Manifest:
    y = lengths(data.train)
    prompt_chars = np.asarray([len(r) for r in rendered(data.train)], np.float64)
    return Manifest(kind=kind, encoder=opts.encoder, encoder_max_tokens=opts.encoder_max_tokens,
                    net=net, train_mean=float(y.mean()), quintiles=quintiles(y),
                    baseline_linear=list(linear_fit(prompt_chars, y)),
                    chars_per_token=chars_per_token(data.train), seed=seed)


def train_proxy(data: TrainData, opts: ProxyOptions, tc: TrainConfig, out: Path) -> Manifest:
    t0 = time.perf_counter()
    bagger = BagTokenizer(opts.encoder)
    encoder = TextEncoder(opts.encoder, opts.encoder_max_tokens) if opts.use_encoder else None
    train_rows = build_rows(data.train, bagger, opts, encoder, "train")
    dev_rows = build_rows(data.dev, bagger, opts, encoder, "dev")
    cfg = NetConfig(table_size=bagger.table_size, num_numeric=len(NUMERIC_NAMES),
                    emb_dim=encoder.dim if encoder else 0, bag_dim=opts.bag_dim,
                    hidden=opts.hidden, quantiles=opts.quantiles,
                    members=opts.members)
    y = lengths(data.train)
    net = fit_members(cfg, train_rows, np.log1p(y), tc, desc="train proxy")
    manifest = base_manifest("proxy", data, opts, cfg, tc.seed)
    cal = calibration(scores(net, train_rows), y)
    dev_out = all_outputs(net, dev_rows).astype(np.float64)
    dev_y = lengths(data.dev)
    dev = quality(np.maximum(cal * np.expm1(dev_out[:, 0]), 1.0), dev_y, manifest.quintiles)
    offsets = conformal_offsets(dev_out, cfg.quantiles, dev_y)
    dev |= {f"{k}_raw": v for k, v in quantile_metrics(dev_out, cfg.quantiles, dev_y).items()}
    dev |= quantile_metrics(shifted(dev_out, offsets), cfg.quantiles, dev_y)  # fitted on dev
    first = np.asarray([is_first_turn(r) for r in data.dev])
    if first.any():
        first_pred = np.maximum(cal * np.expm1(dev_out[first, 0]), 1.0)
        dev["first_kendall_tau"] = quality(first_pred, dev_y[first],
                                           manifest.quintiles)["kendall_tau"]
    out.mkdir(parents=True, exist_ok=True)
    save_net(net, out)
    manifest = msgspec.structs.replace(manifest, calibration=cal, dev_metrics=dev,
                                       quantile_offsets=offsets,
                                       train_seconds=time.perf_counter() - t0)
    write_manifest(out, manifest)
    return manifest
