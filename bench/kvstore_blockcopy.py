"""Time of the kvstore worker's save + load of SmolLM2-shaped blocks (30 layers, 3 KV heads
of 64, 128-token blocks, bfloat16), in the layout the engine's kernel writes here vs kept
in cache order (no reordering: the old grouping), per quantization.

    PYTHONPATH=$PWD .venv/bin/python -m bench.kvstore_blockcopy
"""

from __future__ import annotations

import time

import torch

from kvstore.plan import StepPlan
from kvstore.worker import BlockMover


def main(blocks: int = 8, reps: int = 5) -> None:
    torch.manual_seed(0)
    caches = {f"layer{i}": torch.randn(blocks + 2, 3, 128, 128).to(torch.bfloat16)
              for i in range(30)}
    for quantization in ("none", "int8"):
        for reorder in (True, False):
            mover = BlockMover(quantization)  # type: ignore[arg-type]
            mover.register(caches)
            if not reorder:
                mover._to_tokens = mover._to_cache = (None, None)
            best = float("inf")
            for _ in range(reps):
                started = time.perf_counter()
                mover.apply(StepPlan(saves=[(bytes([b]), b) for b in range(blocks)]))
                mover.apply(StepPlan(loads=[(bytes([b]), b) for b in range(blocks)]))
                best = min(best, time.perf_counter() - started)
            print(f"{quantization:5} {'token-major' if reorder else 'cache order':12} "
                  f"{best:.3f} s per {blocks} blocks saved + loaded (best of {reps}), "
                  f"layout {mover.layout}")


if __name__ == "__main__":
    main()
