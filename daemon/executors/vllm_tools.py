"""vLLM's own tool parsers (`--tool-call-parser`), for `tool_choice: "auto"`: the parser class
vLLM's server composes for the name (ParserManager), one instance per answer, fed the text
and token ids as vLLM's chat serving feeds it, its results turned into daemon.toolcalls'
plain data. Strict tool calling (the structural tags some parsers add to the request under
vLLM's --tool-strict-level) is not applied: the output is parsed, not constrained."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.abstract_parser import Parser
from vllm.parser.parser_manager import ParserManager

from daemon.toolcalls import CallDelta, ParsedCall, ParsedDelta

# The request fields a parser reads (the tools, the choice, reasoning and history).
_FIELDS = ("messages", "model", "tools", "tool_choice", "parallel_tool_calls",
           "include_reasoning", "skip_special_tokens", "chat_template_kwargs")


def _no_nulls(value: Any) -> Any:
    """JSON without its null members (the daemon's request has every field; vLLM's message
    types refuse a null where they expect a field left out)."""
    if isinstance(value, dict):
        return {k: _no_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_no_nulls(v) for v in value]
    return value


def _call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


class VLLMToolParsing:
    """The parser named `name`, checked against the model's tokenizer at start-up (vLLM's
    own check: a parser whose special tokens the tokenizer lacks is refused)."""

    def __init__(self, name: str, tokenizer: Any) -> None:
        try:
            parser = ParserManager.get_parser(tool_parser_name=name, enable_auto_tools=True,
                                              tokenizer=tokenizer)
        except (KeyError, TypeError) as exc:  # unknown name; tokenizer lacks its tokens
            raise ValueError(f"model.tool_call_parser = {name!r}: {exc}") from None
        if parser is None:
            raise ValueError(f"model.tool_call_parser = {name!r}: no such parser")
        self.parser_cls: type[Parser] = parser
        self.tokenizer = tokenizer

    def reader(self, request: dict[str, Any], prompt_token_ids: list[int]) -> VLLMToolReader:
        return self.readers(request, prompt_token_ids, 1)[0]

    def readers(self, request: dict[str, Any], prompt_token_ids: list[int], count: int
                ) -> list[VLLMToolReader]:
        """`count` readers (one per choice: parsers keep state) of one request, which is
        validated once (its size is the client's, and so is `count`)."""
        fields = {k: request[k] for k in _FIELDS if request.get(k) is not None}
        vllm_request = ChatCompletionRequest.model_validate(_no_nulls(fields))
        return [VLLMToolReader(self.parser_cls(self.tokenizer, list(vllm_request.tools or []),
                                               chat_template_kwargs=
                                               vllm_request.chat_template_kwargs),
                               vllm_request, prompt_token_ids) for _ in range(count)]


class VLLMToolReader:
    def __init__(self, parser: Parser, request: ChatCompletionRequest,
                 prompt_token_ids: list[int]) -> None:
        self.parser = parser
        self.request = request
        self.prompt_token_ids: list[int] | None = prompt_token_ids
        parser.set_prompt_token_ids(prompt_token_ids)

    def whole(self, text: str, token_ids: list[int]) -> tuple[str | None, list[ParsedCall]]:
        _, content, calls = self.parser.parse(text, self.request, enable_auto_tools=True,
                                              model_output_token_ids=token_ids)
        return content, [ParsedCall(c.id or _call_id(), c.name, c.arguments)
                         for c in calls or []]

    def delta(self, text: str, token_ids: Sequence[int], finished: bool
              ) -> ParsedDelta | None:
        # vLLM passes the prompt with every delta; the parser reads it once.
        message = self.parser.parse_delta(text, list(token_ids), self.request,
                                          self.prompt_token_ids, finished=finished)
        if message is None:
            return None
        calls = tuple(CallDelta(c.index, c.id, c.function.name if c.function else None,
                                c.function.arguments if c.function else None)
                      for c in message.tool_calls)
        return ParsedDelta(message.content, message.reasoning, calls)
