"""The model's tokenizer and chat template, used to count and build prompt token ids."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

# A tokenizer saved by transformers 5 names its class TokenizersBackend: its tokenizer.json is
# the whole of it, and loading that class directly (as PreTrainedTokenizerFast, its alias) is
# what AutoTokenizer does, without AutoTokenizer's import (the model registry, torch,
# scikit-learn: ~4.5 of a simulated daemon's ~6 s start on a 2-core host). Any other class,
# or none named, goes through AutoTokenizer (it may map a generic name to the model's own).
_PLAIN_CLASS = "TokenizersBackend"


def _load(model_path: str) -> Any:
    """The model's transformers tokenizer (its own class where it names a model-specific one)."""
    try:
        config = json.loads((Path(model_path) / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        config = {}
    if config.get("tokenizer_class") == _PLAIN_CLASS:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(model_path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


class TemplateError(ValueError):
    """The messages do not fit the model's chat template."""


class Tokenizer:
    def __init__(self, model_path: str) -> None:
        self._tok: Any = _load(model_path)

    def render_chat(self, messages: list[dict[str, Any]], *,
                    add_generation_prompt: bool = True, continue_final_message: bool = False,
                    tools: list[dict[str, Any]] | None = None,
                    documents: list[dict[str, str]] | None = None,
                    template_kwargs: dict[str, Any] | None = None) -> str:
        """The chat template's text for `messages` (vLLM's chat options)."""
        try:
            text = self._tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, tools=tools,
                documents=documents, **(template_kwargs or {}))
        except Exception as exc:  # noqa: BLE001 - jinja raises many types for refused messages
            raise TemplateError(f"chat template rejected the messages: {exc}") from None
        return str(text)

    def encode_chat(self, messages: list[dict[str, Any]], *, add_special_tokens: bool = False,
                    **options: Any) -> list[int]:
        """Prompt ids for `messages`: the template's text, tokenized (special tokens added
        only when asked: the template writes its own, as in vLLM)."""
        return self.encode(self.render_chat(messages, **options), add_special_tokens)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def token_strs(self, token_ids: list[int]) -> list[str]:
        return [str(t) for t in self._tok.convert_ids_to_tokens(token_ids)]

    def decode_one(self, token_id: int) -> str:
        return str(self._tok.decode([token_id]))

    def decode(self, token_ids: list[int]) -> str:
        return str(self._tok.decode(token_ids, skip_special_tokens=True))

    @property
    def hf(self) -> Any:
        """The transformers tokenizer itself (vLLM's tool parsers read its vocabulary)."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        return len(self._tok)

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The most characters one token stands for (its vocabulary entry's length bounds
        its text, byte-level or not): a text of C characters has at least C / this many
        tokens, known before tokenizing it."""
        return max((len(token) for token in self._tok.get_vocab()), default=1) or 1
