"""A connector whose worker process exits when it is asked to save a block (vLLM loads it
by module path in tests/executors/test_vllm_kvstore.py): the engine dies at the first
offloaded preemption, as it would with a connector bug that breaks the engine at run
time."""

from __future__ import annotations

import os
from typing import Any

from kvstore.connector import LengthwiseConnector
from kvstore.plan import StepPlan


class CrashingConnector(LengthwiseConnector):
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        plan = self._get_connector_metadata()
        if isinstance(plan, StepPlan) and plan.saves:
            os._exit(3)
        super().start_load_kv(forward_context, **kwargs)
