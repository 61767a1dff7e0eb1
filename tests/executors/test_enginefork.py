"""Engine processes forked from the warm forkserver get what a spawned one would: the
environment their parent had when it started them (not the forkserver's), and the core
binding and thread count vLLM writes into OpenMP variables for its worker (which the
already-loaded OpenMP runtime would otherwise ignore). The real engines' binding is checked
in tests/integration/test_two_engines.py, their restart in tests/reliability."""

from __future__ import annotations

import os
from collections.abc import Iterator
from multiprocessing.connection import Connection

import pytest

from daemon.executors import enginefork


@pytest.mark.parametrize(("env", "cpus"), [
    ({"OMP_PLACES": "{0,2,3}"}, [0, 2, 3]),  # vLLM's form without a preloaded runtime
    ({"GOMP_CPU_AFFINITY": "1 2"}, [1, 2]),  # with libgomp preloaded
    ({"KMP_AFFINITY": "granularity=fine,explicit,proclist=[4,5]"}, [4, 5]),  # libiomp
    ({"OMP_PLACES": "{0-3}"}, [0, 1, 2, 3]),
    ({"OMP_PLACES": "cores"}, None),  # the runtime's own placement: nothing to redo
    ({}, None),
])
def test_bound_cpus_reads_vllms_openmp_variables(env: dict[str, str],
                                                 cpus: list[int] | None) -> None:
    assert enginefork.bound_cpus(env) == cpus


def report(conn: Connection) -> None:
    import torch

    conn.send((os.environ.get("LW_PROBE"), sorted(os.sched_getaffinity(0)),
               torch.get_num_threads()))
    conn.close()


@pytest.fixture
def probe_env() -> Iterator[None]:
    names = ["LW_PROBE", "OMP_PLACES", "OMP_NUM_THREADS"]
    before = {name: os.environ.get(name) for name in names}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.mark.parametrize("context", [enginefork._FORKSERVER, enginefork._FORK],
                         ids=["forkserver", "fork"])
def test_a_forked_child_gets_its_parents_environment_and_binding(
        context: object, probe_env: None) -> None:
    if context is enginefork._FORKSERVER:
        enginefork.use_forkserver()  # as the first CPU engine does: preloads torch, vLLM
    first_cpu = min(os.sched_getaffinity(0))
    os.environ["LW_PROBE"] = "at start"
    os.environ["OMP_PLACES"] = f"{{{first_cpu}}}"
    os.environ["OMP_NUM_THREADS"] = "1"
    reader, writer = context.Pipe(duplex=False)  # type: ignore[attr-defined]
    child = context.Process(target=report, args=(writer,))  # type: ignore[attr-defined]
    child.start()
    os.environ["LW_PROBE"] = "changed after start"
    writer.close()
    assert reader.poll(120), "the child did not report"
    assert reader.recv() == ("at start", [first_cpu], 1)
    child.join(30)
    assert child.exitcode == 0
