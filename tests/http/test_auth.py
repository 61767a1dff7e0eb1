"""API keys in-process (ASGI, simulated executor): 401 in the OpenAI shape without a valid
key, per-key priority ranges, monitoring scope, keys re-read on reload."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import msgspec
import pytest
import pytest_asyncio

from daemon.apikeys import KeyFileError
from daemon.config import Config, EngineConfig, ModelConfig, ServerConfig
from daemon.http.app import build_app
from daemon.service import Service

pytestmark = pytest.mark.asyncio

MODEL = "smollm2-135m-instruct"
USER = "sk-user-0123456789abcdef"
OPS = "sk-ops-0123456789abcdef0"
PROM = "sk-prom-0123456789abcdef"
KEYS = f"""# key   options
{USER}  name=user
{OPS}   name=ops  priority=-100..100   # may jump classes
{PROM}  name=prometheus scope=monitoring
"""


def _ask(priority: int = 0) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "priority": priority}


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest_asyncio.fixture
async def rig(smollm2_model: Path, tmp_path: Path
              ) -> AsyncIterator[tuple[httpx.AsyncClient, Service, Path]]:
    keys = tmp_path / "keys"
    keys.write_text(KEYS)
    config = Config(server=ServerConfig(api_keys_file=str(keys), protect_monitoring=True),
                    model=ModelConfig(path=str(smollm2_model), max_model_len=512),
                    engine=EngineConfig(kind="sim"))
    service = await Service.create(config)
    await service.start()
    transport = httpx.ASGITransport(app=build_app(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        yield http, service, keys
    await service.shutdown()


async def test_requests_need_a_valid_key(
        rig: tuple[httpx.AsyncClient, Service, Path]) -> None:
    http, _, _ = rig
    for headers in ({}, _auth("sk-wrong-0123456789abcdef"), {"authorization": USER}):
        response = await http.post("/v1/chat/completions", json=_ask(), headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert response.headers["www-authenticate"] == "Bearer"
    assert (await http.get("/v1/models")).status_code == 401
    assert (await http.get("/v1/models", headers=_auth(USER))).status_code == 200
    ok = await http.post("/v1/chat/completions", json=_ask(), headers=_auth(USER))
    assert ok.status_code == 200, ok.text


async def test_only_a_key_with_a_range_may_jump_classes(
        rig: tuple[httpx.AsyncClient, Service, Path]) -> None:
    http, _, _ = rig
    jump = await http.post("/v1/completions", headers=_auth(USER),
                           json={"model": MODEL, "prompt": "hi", "max_tokens": 2,
                                 "priority": -5})
    assert jump.status_code == 403
    assert jump.json()["error"]["param"] == "priority"
    later = await http.post("/v1/chat/completions", json=_ask(7), headers=_auth(USER))
    assert later.status_code == 200  # less urgent is always allowed
    ops = await http.post("/v1/chat/completions", json=_ask(-5), headers=_auth(OPS))
    assert ops.status_code == 200, ops.text


async def test_monitoring_needs_a_monitoring_key(
        rig: tuple[httpx.AsyncClient, Service, Path]) -> None:
    http, _, _ = rig
    for path in ("/metrics", "/health"):
        assert (await http.get(path)).status_code == 401
        assert (await http.get(path, headers=_auth(USER))).status_code == 403
        assert (await http.get(path, headers=_auth(PROM))).status_code == 200
    refused = await http.post("/v1/chat/completions", json=_ask(), headers=_auth(PROM))
    assert refused.status_code == 403


async def test_keys_are_reread_on_reload_and_a_bad_file_keeps_the_old(
        rig: tuple[httpx.AsyncClient, Service, Path]) -> None:
    http, service, keys = rig
    fresh = "sk-fresh-0123456789abcdef"
    keys.write_text(f"{fresh} name=fresh\n")
    service.apply(msgspec.structs.replace(service.config))
    assert (await http.get("/v1/models", headers=_auth(USER))).status_code == 401
    assert (await http.get("/v1/models", headers=_auth(fresh))).status_code == 200
    keys.write_text(f"{fresh} name=fresh priority=5..1\n")
    with pytest.raises(KeyFileError, match=r"keys:1: priority must be MIN..MAX"):
        service.apply(msgspec.structs.replace(service.config))
    assert (await http.get("/v1/models", headers=_auth(fresh))).status_code == 200
