"""A connector that also writes each block it saves to a file, as the paged cache holds it
and as kvstore stores it (vLLM loads it by module path in tests/kvstore/test_layout.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kvstore.connector import LengthwiseConnector
from kvstore.plan import StepPlan


class DumpingConnector(LengthwiseConnector):
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        plan, mover = self._get_connector_metadata(), self._mover
        assert isinstance(plan, StepPlan) and mover is not None
        extra = self._vllm_config.kv_transfer_config.kv_connector_extra_config
        folder = Path(extra["trace_path"]).parent / "blocks"
        folder.mkdir(exist_ok=True)
        for _, block_id in plan.saves:
            cache = torch.stack([layer[block_id] for layer in mover._layers])
            torch.save({"cache": cache.clone(), "stored": mover._read(block_id)},
                       folder / f"{len(list(folder.iterdir())):04d}.pt")
        super().start_load_kv(forward_context, **kwargs)
