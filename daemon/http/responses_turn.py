"""One admitted /v1/responses request (a Turn) and what its response is built from: the
response object at each status (vLLM's ResponsesResponse.from_request), the output items of
a whole answer (with the server's tool parser, or a constrained tool choice's calls)."""

from __future__ import annotations

from dataclasses import dataclass

from daemon.core.job import SamplingSpec
from daemon.core.stream import JobEnd
from daemon.http import logprobs as lp
from daemon.http import responses_input as inp
from daemon.http import responses_output as out
from daemon.http import tools
from daemon.http.render import Answer, Choice
from daemon.http.responses_objects import IncompleteDetails, OutputItem, RawMessage, ResponseObject
from daemon.http.responses_schemas import ResponsesRequest, TextConfig
from daemon.http.schemas import ChatMessage, NamedToolChoice
from daemon.toolcalls import ParsedCall, ToolCallReader


@dataclass(slots=True, eq=False)
class Turn:
    """One admitted Responses request: what its response is built from."""

    req: ResponsesRequest
    response_id: str
    created_at: int
    model: str
    spec: SamplingSpec
    chosen: str | NamedToolChoice
    messages: list[ChatMessage]  # the conversation so far (stored for the next turn)
    prompt_text: str
    answer: Answer
    reader: ToolCallReader | None  # "auto" under the server's tool parser
    parsed: bool  # vLLM's parser path: a message only for non-empty content
    shape: lp.Shape | None  # output logprobs, when `include` asks
    text: TextConfig | None  # what the response echoes as `text`

    @property
    def choice(self) -> Choice:
        return self.answer.choices[0]

    @property
    def constrained(self) -> bool:
        return self.chosen == "required" or isinstance(self.chosen, NamedToolChoice)

    def response(self, status: str, output: list[OutputItem] | None = None) -> ResponseObject:
        """The response object (vLLM's ResponsesResponse.from_request)."""
        req, spec, c = self.req, self.spec, self.choice
        done = status not in ("queued", "in_progress")
        raw = None
        if req.enable_response_messages and done:
            raw = [RawMessage("".join(c.text), c.token_ids)] if c.token_ids else []
        return ResponseObject(
            id=self.response_id, created_at=self.created_at,
            incomplete_details=IncompleteDetails("max_output_tokens")
            if status == "incomplete" else None,
            instructions=req.instructions, metadata=req.metadata, model=self.model,
            output=output or [], parallel_tool_calls=req.parallel_tool_calls is not False,
            temperature=spec.temperature, tool_choice=inp.echoed_choice(self.chosen),
            tools=req.tools, top_p=spec.top_p, background=bool(req.background),
            max_output_tokens=spec.max_tokens, max_tool_calls=req.max_tool_calls,
            previous_response_id=req.previous_response_id, reasoning=req.reasoning,
            service_tier=req.service_tier, status=status, text=self.text,
            top_logprobs=spec.logprobs, truncation=req.truncation or "disabled",
            usage=out.usage(len(c.prompt_ids), c.stream.num_tokens) if done else None,
            user=req.user, presence_penalty=spec.presence_penalty,
            frequency_penalty=spec.frequency_penalty,
            input_messages=[RawMessage(self.prompt_text, c.prompt_ids)]
            if req.enable_response_messages and done else None,
            output_messages=raw)

    def status(self, end: JobEnd) -> str:
        if end.error is not None or end.finish_reason == "shed":
            return "failed"
        return "incomplete" if end.finish_reason == "length" else "completed"

    def calls(self) -> list[ParsedCall]:
        """A constrained answer's calls (complete once the answer is)."""
        found = tools.calls(self.chosen, "".join(self.choice.text)) or []
        keep = found[:1] if self.req.parallel_tool_calls is False else found
        return [ParsedCall(c.id, c.function.name, c.function.arguments) for c in keep]

    def whole_output(self) -> list[OutputItem]:
        c = self.choice
        text = "".join(c.text)
        calls: list[ParsedCall] | None = None
        if self.reader is not None:
            content, calls = self.reader.whole(text, c.token_ids)
            text = content or ""
        elif self.constrained:
            text, calls = "", self.calls()
        if calls and self.req.parallel_tool_calls is False:
            calls = calls[:1]
        logprobs = out.logprobs(c.token_ids, c.positions, self.shape)
        return out.whole(text, calls, self.parsed or self.constrained, logprobs)
