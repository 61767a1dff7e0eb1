"""The served model's tokenizer: prompt ids from chat messages (with the assistant's turn
opened), plain text both ways, and a clear error for messages the template refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemon.tokenizer import TemplateError, Tokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Tokenizer:
    return Tokenizer(str(tiny_model))


def test_chat_ids_end_with_the_assistants_turn_opened(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode_chat([{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "Name a colour."}])
    assert ids and all(type(i) is int for i in ids)
    assert tokenizer.decode(ids) == "system\nBe brief.\nuser\nName a colour.\nassistant\n"


def test_text_round_trips_without_special_tokens(tokenizer: Tokenizer) -> None:
    text = "The capital of France is Paris."
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    # The same ids the text has inside a chat prompt, and nothing around them.
    chat = tokenizer.encode_chat([{"role": "user", "content": text}])
    assert any(chat[i:i + len(ids)] == ids for i in range(len(chat)))


@pytest.mark.parametrize("messages", [
    [{"role": "user"}],  # no content
    [{"content": "hi"}],  # no role
    [{"role": "user", "content": 5}],  # not text
])
def test_messages_the_template_refuses_are_a_template_error(tokenizer: Tokenizer,
                                                            messages: list) -> None:
    with pytest.raises(TemplateError, match="chat template rejected the messages") as info:
        tokenizer.encode_chat(messages)
    assert isinstance(info.value, ValueError) and info.value.__suppress_context__


def test_vocab_size_is_the_models(tokenizer: Tokenizer, tiny_model: Path) -> None:
    # The tiny model was built with this tokenizer: its embedding has one row per token.
    assert tokenizer.vocab_size == json.loads((tiny_model / "config.json").read_text())[
        "vocab_size"]
