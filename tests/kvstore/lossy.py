"""A connector whose store loses every block's bytes between saving and loading them
(vLLM loads it by module path in tests/kvstore/test_recompute.py): the index still
promises them, so every load fails."""

from __future__ import annotations

from typing import Any

from kvstore.connector import LengthwiseConnector
from kvstore.plan import StepPlan
from kvstore.store import BlockData


class LossyConnector(LengthwiseConnector):
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        plan, mover = self._get_connector_metadata(), self._mover
        assert isinstance(plan, StepPlan) and mover is not None
        mover.apply(StepPlan(plan.step, plan.drops, plan.saves, [], plan.saving_request_ids))
        mover.data = BlockData(mover.data.quantization)
        mover.apply(StepPlan(plan.step, loads=plan.loads))
