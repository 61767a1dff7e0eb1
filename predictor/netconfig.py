"""LengthNet's shape, torch-free so manifests (and `import predictor`) stay light."""

from __future__ import annotations

import msgspec


class NetConfig(msgspec.Struct, frozen=True, kw_only=True):
    table_size: int  # bag vocabulary: word pieces + hashed bigrams
    num_numeric: int
    emb_dim: int = 0  # frozen encoder embedding width; 0 = no encoder (bags + numerics only)
    bag_dim: int = 32
    hidden: int = 256
    dropout: float = 0.1
    partial: bool = False  # iterative: a third bag over the partial response
    # Quantile levels of log1p(tokens) the net also outputs (pinball loss); () = point only.
    quantiles: tuple[float, ...] = ()
    # Nets trained with seeds seed, seed+1, ...; their outputs are averaged (in log space).
    members: int = 1
