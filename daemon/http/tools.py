"""Tools on /v1/chat/completions, as vLLM's server treats them: a named tool choice or
"required" constrains the answer with a JSON schema (structured outputs) and the answer is
the tool call; "auto" needs a tool parser (model.tool_call_parser, vLLM's
--tool-call-parser); "none" leaves the tools to the chat template only."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec

from daemon.http.errors import bad_request
from daemon.http.responses import FunctionCallOut, ToolCallOut
from daemon.http.schemas import ChatCompletionRequest, NamedToolChoice


def choice(req: ChatCompletionRequest, parser: str) -> str | NamedToolChoice:
    """The effective tool choice ("none", "auto", "required" or the named tool), with
    vLLM's checks and its 400s."""
    if req.tools == []:
        raise bad_request("`tools` must not be an empty array. Either provide at least one "
                          "tool or omit the field entirely.", "tools")
    wanted = req.tool_choice
    if wanted is None:
        wanted = "auto" if req.tools else "none"
    if wanted == "none":
        return "none"
    if not req.tools:
        raise bad_request("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if isinstance(wanted, NamedToolChoice):
        if all(tool.function.name != wanted.function.name for tool in req.tools):
            raise bad_request("The tool specified in `tool_choice` does not match any of the "
                              "specified `tools`", "tool_choice")
        return wanted
    if wanted == "auto" and not parser:
        # vLLM's words; its flags are lengthwise's model.tool_call_parser
        raise bad_request('"auto" tool choice requires --enable-auto-tool-choice and '
                          "--tool-call-parser to be set (lengthwise: model.tool_call_parser)",
                          "tool_choice")
    if req.structured_outputs is not None and wanted != "auto":
        raise bad_request("You can only either use constraints for structured outputs or "
                          "tools, not both.", "structured_outputs")
    return wanted


def schema(req: ChatCompletionRequest, chosen: str | NamedToolChoice) -> str | None:
    """The JSON schema that constrains the answer to the tool call (None: no constraint)."""
    tools = req.tools or []
    if isinstance(chosen, NamedToolChoice):
        tool = next(t for t in tools if t.function.name == chosen.function.name)
        return _json(tool.function.parameters or {"type": "object", "properties": {}})
    if chosen != "required":
        return None
    calls = [{"properties": {"name": {"type": "string", "enum": [t.function.name]},
                             "parameters": t.function.parameters or
                             {"type": "object", "properties": {}}},
              "required": ["name", "parameters"]} for t in tools]
    return _json({"type": "array", "minItems": 1,
                  "items": {"type": "object", "anyOf": calls}})


def _json(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex[:24]}"


def calls(chosen: str | NamedToolChoice, text: str) -> list[ToolCallOut] | None:
    """The tool calls in a constrained answer; None where the choice does not constrain."""
    if isinstance(chosen, NamedToolChoice):
        return [ToolCallOut(call_id(), FunctionCallOut(chosen.function.name, text))]
    if chosen != "required":
        return None
    try:
        items = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return []  # cut by max_tokens: no complete call
    return [ToolCallOut(call_id(), FunctionCallOut(str(item.get("name", "")),
                                                    _json(item.get("parameters", {}))))
            for item in items if isinstance(item, dict)]


def template_tools(req: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The tools as chat templates take them (OpenAI's shape)."""
    if not req.tools:
        return None
    return [{"type": "function",
             "function": {k: v for k, v in msgspec.structs.asdict(t.function).items()
                          if v is not None}} for t in req.tools]
