"""Hostile input through the HTTP stack, in-process (ASGI, simulated executor): for every
integer, float, string, list and mapping field of the request models, nested ones included
(the table is generated from daemon/http/schemas.py, so a new field is covered the day it is
added), the extremes: 0, -1, 2^31, 2^63 and below int64, huge lists and mappings, deep
nesting, a huge string. Each must get a 4xx in the OpenAI error shape or a normal answer,
within TIME_S, without holding the event loop for more than STALL_S of CPU, and the service
must still serve after it. tests/reliability/test_hostile_daemon.py proves the loop's lag on the real
daemon, through its own metric."""

from __future__ import annotations

import asyncio
import gc
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import msgspec
import msgspec.inspect as mi
import pytest
import pytest_asyncio

from daemon.config import Config, EngineConfig, ModelConfig, PredictorConfig, SchedulerConfig
from daemon.http.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    SamplingFields,
    TokenizeRequest,
)
from tests.support import in_process

MODEL = "smollm2-135m-instruct"
HUGE = 20_000  # elements of a huge list or mapping
DEEP = 2_000  # levels of a deeply nested value
HUGE_TEXT = 200_000  # characters of a huge string (of one word: the slowest to tokenize)
TIME_S = 10.0  # an answer or a refusal, on a busy 2-core host
STALL_S = 0.1  # the most CPU the loop may spend without a turn (see _LoopWatch)
SLOT = "__hostile__"
MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")


class Case(NamedTuple):
    path: str  # the endpoint
    field: tuple[str | int, ...]  # where the value goes in the body
    values: list[bytes]  # raw JSON, one request each


def _members(kind: mi.Type) -> list[mi.Type]:
    """The types a field may hold (a union's members, constraints off, null left out)."""
    if isinstance(kind, mi.Metadata):
        return _members(kind.type)
    if isinstance(kind, mi.UnionType):
        return [m for t in kind.types for m in _members(t)]
    return [] if isinstance(kind, mi.NoneType) else [kind]


def _sample(kind: mi.Type) -> Any:
    """A small valid-looking value of a type (list elements, required fields)."""
    member = _members(kind)[0]
    if isinstance(member, mi.StructType):
        return _minimal(member)
    if isinstance(member, mi.LiteralType):
        return member.values[0]
    samples: dict[type, Any] = {mi.IntType: 1, mi.FloatType: 1.0, mi.BoolType: False,
                                mi.StrType: "a", mi.DictType: {}, mi.AnyType: 1}
    if isinstance(member, mi.ListType | mi.VarTupleType):
        return [_sample(member.item_type)]
    return samples.get(type(member), "a")


def _minimal(struct: mi.StructType) -> dict[str, Any]:
    return {f.encode_name: _sample(f.type) for f in struct.fields if f.required}


def _extremes(kind: mi.Type) -> list[bytes]:
    values: list[Any] = []
    for member in _members(kind):
        if isinstance(member, mi.IntType):
            values += [0, -1, 2**31, 2**63, -(2**63) - 1]
        elif isinstance(member, mi.FloatType):
            values += [-1.0, 1e308]
        elif isinstance(member, mi.StrType | mi.LiteralType | mi.AnyType):
            values += ["", "x" * HUGE_TEXT]
        if isinstance(member, mi.ListType | mi.VarTupleType | mi.AnyType):
            item = _sample(member.item_type) if not isinstance(member, mi.AnyType) else 1
            values += [[item] * HUGE, ["x" * HUGE_TEXT] if isinstance(item, str) else None]
        if isinstance(member, mi.DictType | mi.AnyType):
            values.append({f"k{i}": 1 for i in range(HUGE)})
    raw = [json.dumps(v).encode() for v in values if v is not None]
    if any(isinstance(m, mi.ListType | mi.VarTupleType | mi.DictType | mi.AnyType)
           for m in _members(kind)):
        raw.append(b"[" * DEEP + b"]" * DEEP)
    return list(dict.fromkeys(raw))


def _fields(struct: mi.StructType, at: tuple[str | int, ...] = (), skip: frozenset[str] =
            frozenset()) -> Iterator[tuple[tuple[str | int, ...], mi.Type]]:
    """Every field under `struct` (lists of structs through their first element)."""
    for field in struct.fields:
        if field.encode_name in skip:
            continue
        where = (*at, field.encode_name)
        yield where, field.type
        for member in _members(field.type):
            if isinstance(member, mi.StructType) and len(at) < 4:
                yield from _fields(member, where)
            elif isinstance(member, mi.ListType) and isinstance(
                    nested := (_members(member.item_type) or [None])[0], mi.StructType):
                yield from _fields(nested, (*where, 0))


BASES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": MODEL, "max_tokens": 1,
                             "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"model": MODEL, "max_tokens": 1, "prompt": "hi"},
    "/tokenize": {"model": MODEL, "prompt": "hi"},
    "/detokenize": {"model": MODEL, "tokens": [1]},
}
# What a nested field needs beside it to be read at all.
COMPANIONS: dict[str, dict[str, Any]] = {
    "stream_options": {"stream": True},
    "tool_choice": {"tools": [{"type": "function", "function": {"name": "a"}}]},
}


def _cases() -> list[Case]:
    shared = frozenset(SamplingFields.__struct_fields__)
    models = [("/v1/chat/completions", ChatCompletionRequest, frozenset()),
              ("/v1/completions", CompletionRequest, shared),  # shared: tested on chat
              ("/tokenize", TokenizeRequest, frozenset()),
              ("/detokenize", DetokenizeRequest, frozenset())]
    cases = []
    for path, model, skip in models:
        info = mi.type_info(model)
        assert isinstance(info, mi.StructType)
        cases += [Case(path, field, values) for field, kind in _fields(info, skip=skip)
                  if (values := _extremes(kind))]
    return cases


def _body(case: Case, value: bytes) -> bytes:
    body: Any = json.loads(json.dumps(BASES[case.path]))
    body.update(COMPANIONS.get(str(case.field[0]), {}))
    node = body
    for step, following in zip(case.field, case.field[1:], strict=False):
        container = list if isinstance(following, int) else dict
        if isinstance(node, dict) and not isinstance(node.get(step), container):
            node[step] = [{}] if container is list else {}  # ("content": "hi" -> parts)
        node = node[step]
    node[case.field[-1]] = SLOT
    return json.dumps(body).encode().replace(json.dumps(SLOT).encode(), value, 1)


class _LoopWatch:
    """The most CPU the event loop's thread spent between two turns of a 2 ms timer (since
    `longest` was reset): work that held the loop. CPU time, not wall time, so that a
    busy host's scheduling delays do not count (the real daemon's wall-clock lag metric is
    tests/reliability/test_hostile_daemon.py's)."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            start = time.thread_time()
            await asyncio.sleep(0.002)
            self.longest = max(self.longest, time.thread_time() - start)

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def rig(smollm2_model: Path) -> AsyncIterator[tuple[httpx.AsyncClient, _LoopWatch]]:
    config = Config(model=ModelConfig(path=str(smollm2_model), max_model_len=512),
                    engine=EngineConfig(kind="sim", max_num_seqs=8),
                    scheduler=SchedulerConfig(max_running=8),
                    predictor=PredictorConfig(path="none"))
    async with in_process(config) as (client, service):
        gc.collect()
        gc.freeze()  # as the daemon does once started (lifecycle.py): no full-heap pauses
        watch = _LoopWatch()
        try:
            yield client, watch
        finally:
            await watch.close()
            gc.unfreeze()
        assert service.scheduler.num_jobs == 0


def _check_answer(case: Case, value: bytes, response: httpx.Response) -> None:
    where = f"{case.path} {'.'.join(map(str, case.field))} = {value[:40]!r}"
    assert response.status_code < 500, (where, response.text[:300])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"], where
        assert error["type"] and set(error) == {"message", "type", "param", "code"}, where
        return
    assert response.status_code == 200, where
    if response.headers["content-type"].startswith("text/event-stream"):
        assert response.text.rstrip().endswith("data: [DONE]"), (where, response.text[-200:])
    else:
        assert isinstance(msgspec.json.decode(response.content), dict), where


CASES = _cases()


@MODULE_LOOP
@pytest.mark.parametrize("case", CASES, ids=[f"{c.path}:{'.'.join(map(str, c.field))}"
                                             for c in CASES])
async def test_extremes_get_a_4xx_or_an_answer(rig: tuple[httpx.AsyncClient, _LoopWatch],
                                               case: Case) -> None:
    http, watch = rig
    for value in case.values:
        body = _body(case, value)
        watch.longest = 0.0
        started = time.perf_counter()
        response = await http.post(case.path, content=body,
                                   headers={"content-type": "application/json"},
                                   timeout=TIME_S)
        seconds = time.perf_counter() - started
        _check_answer(case, value, response)
        assert seconds < TIME_S
        assert watch.longest < STALL_S, (case.field, value[:40], watch.longest)
    assert (await http.get("/health")).status_code == 200
    still = await http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})
    assert still.status_code == 200, still.text


def test_the_table_covers_every_kind_of_field() -> None:
    fields = {(c.path, c.field) for c in CASES}
    assert ("/v1/chat/completions", ("n",)) in fields
    assert ("/v1/chat/completions", ("messages", 0, "content")) in fields
    assert ("/v1/chat/completions", ("tools", 0, "function", "parameters")) in fields
    assert ("/v1/chat/completions", ("logit_bias",)) in fields
    assert ("/v1/completions", ("prompt",)) in fields
    assert ("/detokenize", ("tokens",)) in fields
    assert len(CASES) > 100
