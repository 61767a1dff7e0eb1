"""vLLM's request models are the contract: every field the installed vLLM's OpenAI server
declares on /v1/chat/completions, /v1/completions, /v1/responses, /tokenize and /detokenize,
and its Anthropic server on /v1/messages and /v1/messages/count_tokens (with their messages,
content blocks, tools and tool choice), is a field here (read from vLLM's pydantic classes,
so a vLLM upgrade that adds one fails this test)."""

from __future__ import annotations

import msgspec
import pytest

from daemon.http.anthropic_schemas import (
    AnthropicContentBlock,
    AnthropicCountTokensRequest,
    AnthropicMessage,
    AnthropicMessagesRequest,
    AnthropicTool,
    AnthropicToolChoice,
)
from daemon.http.responses_schemas import REFUSED as RESPONSES_REFUSED
from daemon.http.responses_schemas import ResponsesRequest
from daemon.http.schemas import (
    REFUSED,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)

ANTHROPIC = "vllm.entrypoints.anthropic.protocol"


def _vllm_fields(module: str, name: str) -> set[str]:
    import importlib

    model = getattr(importlib.import_module(module), name)
    return {field.alias or key for key, field in model.model_fields.items()}


def _ours(kind: type[msgspec.Struct]) -> set[str]:
    return {f.encode_name for f in msgspec.structs.fields(kind)}


@pytest.mark.parametrize(("module", "name", "ours"), [
    ("vllm.entrypoints.openai.chat_completion.protocol", "ChatCompletionRequest",
     ChatCompletionRequest),
    ("vllm.entrypoints.openai.completion.protocol", "CompletionRequest", CompletionRequest),
    ("vllm.entrypoints.serve.tokenize.protocol", "TokenizeCompletionRequest", TokenizeRequest),
    ("vllm.entrypoints.serve.tokenize.protocol", "TokenizeChatRequest", TokenizeRequest),
    ("vllm.entrypoints.serve.tokenize.protocol", "DetokenizeRequest", DetokenizeRequest),
    (ANTHROPIC, "AnthropicMessagesRequest", AnthropicMessagesRequest),
    (ANTHROPIC, "AnthropicCountTokensRequest", AnthropicCountTokensRequest),
    (ANTHROPIC, "AnthropicMessage", AnthropicMessage),
    (ANTHROPIC, "AnthropicContentBlock", AnthropicContentBlock),
    (ANTHROPIC, "AnthropicTool", AnthropicTool),
    (ANTHROPIC, "AnthropicToolChoice", AnthropicToolChoice),
    ("vllm.entrypoints.openai.responses.protocol", "ResponsesRequest", ResponsesRequest),
])
def test_every_field_vllm_accepts_is_declared(module: str, name: str,
                                               ours: type[msgspec.Struct]) -> None:
    missing = _vllm_fields(module, name) - _ours(ours)
    assert missing == set(), f"vLLM's {name} accepts {sorted(missing)}; lengthwise lacks them"


def test_refused_fields_are_declared_and_few() -> None:
    """Each refused field is a declared one, with its reason; the list stays short."""
    declared = _ours(ChatCompletionRequest) | _ours(CompletionRequest)
    assert set(REFUSED) <= declared
    vllm = (_vllm_fields("vllm.entrypoints.openai.chat_completion.protocol",
                         "ChatCompletionRequest")
            | _vllm_fields("vllm.entrypoints.openai.completion.protocol", "CompletionRequest"))
    # vLLM's fields refused here, each refused by vLLM's default server too, or needing a
    # model kind this server does not run (the reasons are in REFUSED).
    assert set(REFUSED) & vllm == {"use_beam_search", "chat_template", "prompt_embeds",
                                   "suffix", "ec_transfer_params", "media_io_kwargs",
                                   "mm_processor_kwargs"}


def test_responses_refused_fields_are_vllms_or_openais() -> None:
    """Each refused Responses field is declared; those of vLLM's are ones its server refuses
    too or that need a kind of model this server does not run."""
    assert set(RESPONSES_REFUSED) <= _ours(ResponsesRequest)
    vllm = _vllm_fields("vllm.entrypoints.openai.responses.protocol", "ResponsesRequest")
    assert set(RESPONSES_REFUSED) & vllm == {"prompt", "previous_input_messages",
                                             "media_io_kwargs", "mm_processor_kwargs",
                                             "ec_transfer_params"}
