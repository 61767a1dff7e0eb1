"""/v1/chat/completions/render and /v1/completions/render (daemon/http/prompt_render.py): the
prompt's token ids (those /tokenize gives, those a job would run), the sampling settings
under vLLM's names without its defaults, vLLM's GenerateRequest shape; bad input a 400 in
the OpenAI shape; nothing runs. In-process on the simulated executor; against vLLM's own
server: tests/integration/test_differential.py (messages_cases.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import msgspec
import pytest
import pytest_asyncio

from daemon.core.job import SamplingSpec, StructuredSpec
from daemon.http.prompt_render import sampling
from daemon.service import Service
from tests.support import in_process, sim_config

ASYNC = pytest.mark.asyncio(loop_scope="module")
MODEL = "tiny-llama"
HELLO = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
# vLLM's GenerateRequest, field for field
FIELDS = {"request_id", "token_ids", "token_offsets", "features", "content_parts",
          "sampling_params", "model", "reasoning_ended", "reasoning_parser_kwargs",
          "return_token_ids", "output_mode", "stream", "stream_options", "cache_salt",
          "priority", "kv_transfer_params", "ec_transfer_params"}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def served(tiny_model: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Service]]:
    async with in_process(sim_config(tiny_model, 64)) as both:
        yield both


@ASYNC
async def test_chat_render_is_the_templated_prompt(
        served: tuple[httpx.AsyncClient, Service]) -> None:
    http, service = served
    response = await http.post("/v1/chat/completions/render", json={
        "model": MODEL, "messages": HELLO, "max_tokens": 5, "temperature": 0,
        "stop": ["\n"], "request_id": "r1", "stream": True,
        "stream_options": {"include_usage": True}, "priority": 3})
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == FIELDS
    tokens = await http.post("/tokenize", json={"model": MODEL, "messages": HELLO})
    assert body["token_ids"] == tokens.json()["tokens"]
    assert body["request_id"] == "chatcmpl-r1" and body["output_mode"] == "tokens"
    assert body["sampling_params"] == {"max_tokens": 5, "temperature": 0.0, "stop": ["\n"]}
    assert (body["stream"], body["stream_options"]["include_usage"], body["priority"]) == \
        (True, True, 3)
    assert service.scheduler.num_jobs == 0


@ASYNC
async def test_completions_render_one_per_prompt(
        served: tuple[httpx.AsyncClient, Service]) -> None:
    http, _ = served
    response = await http.post("/v1/completions/render", json={
        "model": MODEL, "prompt": ["Once upon", [1, 2, 3]], "seed": 7})
    assert response.status_code == 200, response.text
    first, second = response.json()
    base = first["request_id"].removesuffix("-0")
    assert base.startswith("cmpl-") and second["request_id"] == f"{base}-1"
    tokens = await http.post("/tokenize", json={"model": MODEL, "prompt": "Once upon"})
    assert first["token_ids"] == tokens.json()["tokens"] and second["token_ids"] == [1, 2, 3]
    assert first["sampling_params"] == {"seed": 7}  # vLLM's default max_tokens: 16
    single = await http.post("/v1/completions/render", json={"model": MODEL, "prompt": "x"})
    assert single.json()[0]["request_id"].count("-") == 1


@ASYNC
@pytest.mark.parametrize(("path", "fields", "param"), [
    ("/v1/chat/completions/render", {"messages": HELLO, "frobnicate": 1}, "frobnicate"),
    ("/v1/chat/completions/render", {"messages": HELLO, "model": "other"}, "model"),
    ("/v1/chat/completions/render", {"messages": []}, "messages"),
    ("/v1/chat/completions/render", {"messages": HELLO, "max_tokens": 60}, "max_tokens"),
    ("/v1/completions/render", {"prompt": [99999999]}, "prompt"),
    ("/v1/completions/render", {}, "prompt"),
])
async def test_bad_input_is_a_400_naming_the_field(
        served: tuple[httpx.AsyncClient, Service], path: str, fields: dict[str, object],
        param: str) -> None:
    http, _ = served
    response = await http.post(path, json={"model": MODEL, **fields})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_sampling_leaves_out_vllms_defaults() -> None:
    assert msgspec.to_builtins(sampling(SamplingSpec(max_tokens=16))) == {}
    spec = SamplingSpec(max_tokens=3, top_k=5, logit_bias=((7, 1.5),), bad_words=("x",),
                        structured=StructuredSpec(json='{"type": "object"}'))
    assert msgspec.json.decode(msgspec.json.encode(sampling(spec))) == {
        "max_tokens": 3, "top_k": 5, "logit_bias": {"7": 1.5}, "bad_words": ["x"],
        "structured_outputs": {"json": '{"type": "object"}'}}

