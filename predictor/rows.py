"""Featurised rows kept as numpy, sliced into torch batches for training and serving."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from predictor.features import BagTokenizer, numeric_features, partial_features
from predictor.net import NetInput
from predictor.records import Turn, current_prompt, render


@dataclass(slots=True)
class FeatureRows:
    prompt_bags: list[np.ndarray]
    hist_bags: list[np.ndarray]
    numeric: np.ndarray  # [N, F] float32
    emb: np.ndarray | None = None  # [N, D] float32
    out_bags: list[np.ndarray] | None = None  # iterative only

    def __len__(self) -> int:
        return len(self.prompt_bags)

    def batch(self, idx: Sequence[int] | np.ndarray) -> NetInput:
        p_ids, p_off = _flat([self.prompt_bags[i] for i in idx])
        h_ids, h_off = _flat([self.hist_bags[i] for i in idx])
        x = NetInput(prompt_ids=p_ids, prompt_offsets=p_off, hist_ids=h_ids, hist_offsets=h_off,
                     numeric=torch.from_numpy(self.numeric[list(idx)]))
        if self.emb is not None:
            x.emb = torch.from_numpy(self.emb[list(idx)])
        if self.out_bags is not None:
            x.out_ids, x.out_offsets = _flat([self.out_bags[i] for i in idx])
        return x


def _flat(rows: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return torch.from_numpy(np.concatenate(rows)), torch.from_numpy(offsets)


def _split_bag(bag) -> list[np.ndarray]:
    ends = list(bag.offsets[1:]) + [len(bag.ids)]
    return [bag.ids[s:e] for s, e in zip(bag.offsets, ends)]


def featurize(bagger: BagTokenizer, conversations: Sequence[Sequence[Turn]]) -> FeatureRows:
    """Prompt bag (current turn), history bag (last 512 pieces of earlier turns), numerics."""
    prompts = [current_prompt(m) for m in conversations]
    histories = [render(m[:-1]) for m in conversations]
    numeric = np.asarray([numeric_features(m) for m in conversations], dtype=np.float32)
    return FeatureRows(prompt_bags=_split_bag(bagger.bag(prompts)),
                       hist_bags=_split_bag(bagger.bag(histories)),
                       numeric=numeric.reshape(len(conversations), -1))


def add_partials(bagger: BagTokenizer, rows: FeatureRows, partials: Sequence[str],
                 generated: Sequence[int]) -> FeatureRows:
    """Iterative rows: the last 512 pieces of the partial answer plus its shape features."""
    extra = np.asarray([partial_features(p, g) for p, g in zip(partials, generated)],
                       dtype=np.float32).reshape(len(partials), -1)
    return FeatureRows(prompt_bags=rows.prompt_bags, hist_bags=rows.hist_bags,
                       numeric=np.concatenate([rows.numeric, extra], axis=1), emb=rows.emb,
                       out_bags=_split_bag(bagger.bag(partials)))
