"""Single-request predict latency on long prompts, several models interleaved (fair on a
shared CPU): p50 / p99 ms over conversations of >= 3,000 characters (>= 512 pieces).

    python -m bench.predictor.latency out/data/sharegpt_dev.jsonl MODEL_DIR [MODEL_DIR ...]
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

from predictor import PredictInput, load_predictor
from predictor.evaluate import LONG_PROMPT_CHARS, single_request_ms
from predictor.records import read_records, render


def main(data_path: str, models: list[str], rounds: int = 5, per_round: int = 40) -> None:
    torch.set_num_threads(1)
    records = [r for r in read_records(data_path)
               if len(render(r.messages)) >= LONG_PROMPT_CHARS][:200]
    inputs = [PredictInput.from_record(r) for r in records]
    loaded = {path: load_predictor(path) for path in models}
    ms: dict[str, list[float]] = {path: [] for path in models}
    for _ in range(rounds):
        for path, model in loaded.items():
            ms[path].extend(single_request_ms(model.predict, inputs, per_round))
    print(json.dumps({path: {"p50_ms": round(float(np.percentile(v, 50)), 2),
                             "p99_ms": round(float(np.percentile(v, 99)), 2), "n": len(v)}
                      for path, v in ms.items()}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
