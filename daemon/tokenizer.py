"""The model's tokenizer and chat template, used to count and build prompt token ids."""

from __future__ import annotations

from typing import Any


class TemplateError(ValueError):
    """The messages do not fit the model's chat template."""


class Tokenizer:
    def __init__(self, model_path: str) -> None:
        from transformers import AutoTokenizer

        self._tok: Any = AutoTokenizer.from_pretrained(model_path)

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        try:
            ids = self._tok.apply_chat_template(messages, add_generation_prompt=True,
                                                tokenize=True)
        except Exception as exc:  # noqa: BLE001 - jinja raises many types for refused messages
            raise TemplateError(f"chat template rejected the messages: {exc}") from None
        if not isinstance(ids, list):  # some versions return a BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, token_ids: list[int]) -> str:
        return str(self._tok.decode(token_ids, skip_special_tokens=True))

    @property
    def vocab_size(self) -> int:
        return len(self._tok)
