"""Counts output tokens under the serving model's tokenizer (tokenizer.json in a HF folder)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer


class TokenCounter:
    """Counts without special tokens: the length the engine generates, bar the final EOS."""

    def __init__(self, model_dir: str | Path) -> None:
        path = Path(model_dir)
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json" if path.is_dir() else path))

    def count_batch(self, texts: list[str]) -> list[int]:
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [len(e.ids) for e in encodings]

    def prefixes(self, text: str, every: int, limit: int) -> list[str]:
        """Decoded prefixes of `text` at every `every` tokens (1..limit windows), for ELIS."""
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        cuts = range(every, min(len(ids), every * limit + 1), every)
        return [self.tokenizer.decode(ids[:cut]) for cut in cuts]
