"""A records workload file (bench/workload/lengths.py `records:PATH`) with long and short answers."""

from __future__ import annotations

from pathlib import Path


def long_and_short(tmp_path: Path, n: int, every: int, long: int, short: int) -> Path:
    """n prompts; every `every`-th answer is `long` tokens, the others `short`."""
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(
        f'{{"prompt": "p{i}", "output_tokens": {long if i % every == 0 else short}}}'
        for i in range(n)))
    return path
