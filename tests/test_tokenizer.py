"""The served model's tokenizer: prompt ids from chat messages (with the assistant's turn
opened), plain text both ways, and a clear error for messages the template refuses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.tokenizer import TemplateError, Tokenizer
from tests.support import ROOT


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


def test_a_plain_tokenizer_loads_as_autotokenizer_would_without_importing_torch(
        tiny_model: Path, smollm2_model: Path) -> None:
    """Both packaged models name TokenizersBackend: loaded directly, the same class and ids
    as AutoTokenizer's, and the loads leave torch unimported (a fresh interpreter)."""
    messages = [{"role": "user", "content": "Name a colour."}]
    script = ("import sys, json; from daemon.tokenizer import Tokenizer; "
              "ts = [Tokenizer(p) for p in sys.argv[2:]]; "
              "print(json.dumps(['torch' in sys.modules] + [[type(t.hf).__name__, "
              "t.encode_chat(json.loads(sys.argv[1]))] for t in ts]))")
    paths = [str(tiny_model), str(smollm2_model)]
    out = subprocess.run([sys.executable, "-c", script, json.dumps(messages), *paths],
                         capture_output=True, text=True, check=True, timeout=120, cwd=ROOT)
    torch_imported, *loaded = json.loads(out.stdout.splitlines()[-1])
    assert not torch_imported
    from transformers import AutoTokenizer

    for path, (name, ids) in zip(paths, loaded, strict=True):
        auto = AutoTokenizer.from_pretrained(path)
        assert name == type(auto).__name__
        assert ids == auto.encode(auto.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True), add_special_tokens=False)
