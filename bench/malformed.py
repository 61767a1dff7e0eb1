"""A corpus of malformed and unsupported OpenAI requests, each with the status it must get
and the field its error must name (None: no single field). Used by the tests and by
`lengthwise chaos`."""

from __future__ import annotations

import json
from typing import NamedTuple

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"


class Case(NamedTuple):
    name: str
    path: str
    body: bytes
    status: int
    param: str | None


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def corpus(model: str) -> list[Case]:
    def chat(**fields: object) -> bytes:
        return json.dumps({"model": model, "messages": [{"role": "user", "content": "hello"}],
                           "max_tokens": 2, **fields}).encode()

    def cmpl(**fields: object) -> bytes:
        return json.dumps({"model": model, "prompt": "hi", "max_tokens": 2, **fields}).encode()

    def extra(raw: bytes) -> bytes:  # a field JSON cannot be written by json.dumps
        return chat()[:-1] + b", " + raw + b"}"

    return [
        Case("deep JSON in a typed field", CHAT, extra(b'"user": ' + _deep(1000)), 400, "user"),
        Case("deep JSON in the prompt", CMPL, b'{"model": "%s", "prompt": %s}'
             % (model.encode(), _deep(5000)), 400, None),
        Case("deep JSON in an object field", CHAT, extra(b'"kv_transfer_params": '
                                                         + _deep(5000)), 400, None),
        Case("invalid UTF-8 in a string", CHAT, chat().replace(b"hello", b"he\xff\xfello"),
             400, None),
        Case("lone surrogate escape", CHAT, chat().replace(b"hello", b"he\\ud800llo"), 400,
             None),
        Case("empty stop string", CHAT, chat(stop=""), 400, "stop"),
        Case("empty stop string in a list", CHAT, chat(stop=["a", ""]), 400, "stop[1]"),
        # vLLM's request limits (its defaults): a 400 at once, never a 429
        Case("n far beyond vLLM's limit", CHAT, chat(n=2**40), 400, "n"),
        Case("more stop strings than vLLM takes", CHAT, chat(stop=["a"] * 5), 400, "stop"),
        Case("more prompts than vLLM takes", CMPL, cmpl(prompt=["a"] * 1025), 400, "prompt"),
        Case("seed beyond int64", CHAT, chat(seed=2**70), 400, "seed"),
        Case("priority far out of range", CHAT, chat(priority=10**30), 400, "priority"),
        Case("priority below any range", CHAT, chat(priority=-(2**63)), 400, "priority"),
        Case("max_tokens beyond any int", CHAT, chat(max_tokens=10**30), 400, "max_tokens"),
        Case("temperature infinite", CHAT, extra(b'"temperature": 1e400'), 400, "temperature"),
        Case("unknown field", CHAT, chat(frobnicate=1), 400, "frobnicate"),
        Case("tools without a parser (auto)", CHAT,
             chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tool_choice"),
        Case("tool_choice naming no tool", CHAT,
             chat(tools=[{"type": "function", "function": {"name": "f"}}],
                  tool_choice={"type": "function", "function": {"name": "g"}}), 400,
             "tool_choice"),
        Case("tool_choice without tools", CHAT, chat(tool_choice="required"), 400,
             "tool_choice"),
        Case("empty tools", CHAT, chat(tools=[]), 400, "tools"),
        Case("response_format of an unknown type", CHAT, chat(response_format={"type": "xml"}),
             400, "response_format.type"),
        Case("json_schema format without its schema", CHAT,
             chat(response_format={"type": "json_schema"}), 400, "response_format"),
        Case("top_logprobs without logprobs", CHAT, chat(top_logprobs=3), 400, "top_logprobs"),
        Case("logprobs not a bool", CHAT, chat(logprobs="yes"), 400, "logprobs"),
        Case("logprobs below -1", CMPL, cmpl(logprobs=-2), 400, "logprobs"),
        Case("logit_bias token not a number", CHAT, chat(logit_bias={"x": 1}), 400,
             "logit_bias"),
        Case("logit_bias value not a number", CHAT, chat(logit_bias={"1": "a"}), 400,
             "logit_bias"),
        Case("best_of", CMPL, cmpl(best_of=2), 400, "best_of"),
        Case("suffix", CMPL, cmpl(suffix="x"), 400, "suffix"),
        Case("beam search", CMPL, cmpl(use_beam_search=True), 400, "use_beam_search"),
        Case("chat template in the request", CHAT, chat(chat_template="{{ x }}"), 400,
             "chat_template"),
        Case("echo not a bool", CMPL, cmpl(echo="yes"), 400, "echo"),
        Case("top_k below -1", CHAT, chat(top_k=-2), 400, "top_k"),
        Case("top_k not an int", CHAT, chat(top_k=1.5), 400, "top_k"),
        Case("min_p above 1", CHAT, chat(min_p=1.5), 400, "min_p"),
        Case("repetition_penalty 0", CMPL, cmpl(repetition_penalty=0), 400,
             "repetition_penalty"),
        Case("stop_token_ids negative", CMPL, cmpl(stop_token_ids=[-1]), 400,
             "stop_token_ids[0]"),
        Case("stop_token_ids out of the vocabulary", CMPL, cmpl(stop_token_ids=[10**9]), 400,
             "stop_token_ids"),
        Case("allowed_token_ids not a list", CMPL, cmpl(allowed_token_ids=5), 400,
             "allowed_token_ids"),
        Case("allowed_token_ids out of the vocabulary", CMPL,
             cmpl(allowed_token_ids=[10**9]), 400, "allowed_token_ids"),
        Case("logprobs beyond max_logprobs", CMPL, cmpl(logprobs=10**6), 400, "logprobs"),
        Case("prompt_logprobs while streaming", CMPL, cmpl(prompt_logprobs=1, stream=True),
             400, "prompt_logprobs"),
        Case("stream_options without stream", CHAT, chat(stream_options={
            "include_usage": True}), 400, "stream_options"),
        Case("continuous_usage_stats not a bool", CHAT, chat(stream=True, stream_options={
            "continuous_usage_stats": "x"}), 400, "stream_options.continuous_usage_stats"),
        Case("bad_words not a list", CHAT, chat(bad_words="x"), 400, "bad_words"),
        Case("structured_outputs with two kinds", CHAT, chat(structured_outputs={
            "regex": "a", "choice": ["a"]}), 400, "structured_outputs"),
        Case("structured_outputs choice not a list", CHAT, chat(structured_outputs={
            "choice": "a"}), 400, "structured_outputs.choice"),
        Case("n = 0", CHAT, chat(n=0), 400, "n"),
        Case("n > 1 with greedy sampling", CHAT, chat(n=2, temperature=0), 400, "n"),
        Case("min_tokens above max_tokens", CHAT, chat(min_tokens=5), 400, "min_tokens"),
        Case("truncate_prompt_tokens below -1", CMPL, cmpl(truncate_prompt_tokens=-2), 400,
             "truncate_prompt_tokens"),
        Case("truncation_side unknown", CMPL, cmpl(truncation_side="middle"), 400,
             "truncation_side"),
        Case("cache_salt empty", CMPL, cmpl(cache_salt=""), 400, "cache_salt"),
        Case("skip_special_tokens not a bool", CMPL, cmpl(skip_special_tokens=3), 400,
             "skip_special_tokens"),
        Case("add_generation_prompt with continue_final_message", CHAT,
             chat(continue_final_message=True), 400, "continue_final_message"),
        Case("chat_template_kwargs not an object", CHAT, chat(chat_template_kwargs=[1]), 400,
             "chat_template_kwargs"),
        Case("thinking_token_budget below -1", CHAT, chat(thinking_token_budget=-5), 400,
             "thinking_token_budget"),
        Case("vllm_xargs of a wrong type", CHAT, chat(vllm_xargs={"a": {"b": 1}}), 400,
             "vllm_xargs"),
        Case("reasoning_effort unknown", CHAT, chat(reasoning_effort="huge"), 400,
             "reasoning_effort"),
        Case("priority not an int", CHAT, chat(priority="high"), 400, "priority"),
        Case("role of the wrong type", CHAT, chat(messages=[{"role": 5, "content": "x"}]), 400,
             "messages[0].role"),
        Case("messages not a list", CHAT, chat(messages="hi"), 400, "messages"),
        Case("no messages", CHAT, chat(messages=[]), 400, "messages"),
        Case("image part", CHAT, chat(messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "x"}}]}]), 400, "messages[0].content"),
        Case("body is an array", CHAT, b"[]", 400, None),
        Case("body is null", CHAT, b"null", 400, None),
        Case("trailing garbage", CHAT, chat() + b"}", 400, None),
        Case("prompt batch with an empty prompt", CMPL, cmpl(prompt=[[1, 2], []]), 400,
             "prompt"),
        Case("prompt mixing ids and texts", CMPL, cmpl(prompt=[1, "a"]), 400, "prompt"),
        Case("token id out of the vocabulary", CMPL, cmpl(prompt=[10**30]), 400, "prompt[0]"),
        Case("unknown model", CHAT, chat(model="gpt-9"), 400, "model"),
    ]
