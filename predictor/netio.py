"""Saving a LengthNet small (float16 on disk) and loading it back as float32."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from predictor.model import LengthEnsemble, Net, NetConfig, build_net

WEIGHTS = "net.pt"


def _halved(key: str) -> bool:
    """Weights stored float16: the bag table and the MLP (of each member)."""
    return key.split("members.", 1)[-1].lstrip("0123456789.").startswith(("table", "mlp"))


def save_net(net: Net, folder: Path) -> None:
    state = {k: (v.half() if v.is_floating_point() and v.dim() > 0 and _halved(k) else v)
             for k, v in net.state_dict().items()}
    tmp = folder / (WEIGHTS + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, folder / WEIGHTS)


def load_net(cfg: NetConfig, folder: Path) -> Net:
    net = build_net(cfg)
    state = torch.load(folder / WEIGHTS, map_location="cpu", weights_only=True)
    bad = [k for k, v in state.items() if v.is_floating_point() and not bool(v.isfinite().all())]
    if bad:
        raise ValueError(f"{folder / WEIGHTS}: non-finite weights in {', '.join(bad)}")
    net.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    if isinstance(net, LengthEnsemble):
        net.fuse()
    return net.eval()
