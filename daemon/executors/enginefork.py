"""CPU engine processes forked from a warm process instead of spawned from scratch.

On CPU, vLLM starts each engine (its EngineCore process) and that engine's model worker as
*spawned* processes: fresh interpreters that import torch and vLLM again, about 10 s of CPU
each, which was nearly all of an engine restart (docs/operations.md). With
`[engine] start_method = "forkserver"` (the default), the daemon instead starts one
multiprocessing forkserver that holds torch and vLLM imported; every EngineCore is forked
from it, and each EngineCore forks its worker. A restart then pays for no import at all.
`lengthwise serve` forks that forkserver from itself once it has imported them (fork_now),
so a first start pays for one import of torch and vLLM, the daemon's own; elsewhere (a test
process driving an engine) multiprocessing spawns it, and it imports them again.

Every engine process started here (forked, or spawned with start_method = "spawn") ends
with the daemon, however the daemon ends (lifeline.py).

A forked process does not get two things a spawned one gets, so it applies them itself
before it runs:
- the environment its parent had when it started it (a forkserver child would otherwise
  have the forkserver's): each process carries a copy, taken at start(), and installs it.
  The daemon sets each engine's core binding and KV size in its environment
  (spawn.build_with_env), and vLLM sets the worker's OpenMP variables the same way.
- those OpenMP variables' effect: the OpenMP runtime read them when torch was imported, in
  the forkserver, so the child sets its thread count (OMP_NUM_THREADS) and CPU affinity
  (OMP_PLACES, GOMP_CPU_AFFINITY or KMP_AFFINITY, as vLLM writes them) itself. Threads
  the runtime creates later inherit that affinity.
"""

from __future__ import annotations

import importlib
import os
import re
import socket
import sys
from collections.abc import Mapping
from multiprocessing import connection, forkserver, resource_tracker, util
from multiprocessing import context as mp_context
from typing import Any

from daemon.executors import lifeline, spawn

# Imported once by the forkserver, so that engine processes forked from it start warm.
PRELOAD = ["torch", "vllm.v1.engine.core", "vllm.v1.executor.multiproc_executor",
           "vllm.v1.worker.cpu_worker", "vllm.v1.worker.cpu_model_runner",
           "daemon.executors.enginefork", "daemon.executors.forkserver_lifeline"]
_SPAWNED_ONLY = "daemon.executors.forkserver_lifeline"  # holds its importer's parent
# vLLM modules that start processes, each with its own reference to get_mp_context.
_STARTERS = ["vllm.v1.engine.utils", "vllm.v1.executor.multiproc_executor",
             "vllm.v1.engine.coordinator"]


def _ids(text: str) -> list[int]:
    """CPU ids from a list like "0,2-3" or "0 1 2"."""
    ids: list[int] = []
    for item in re.split(r"[\s,]+", text.strip()):
        low, _, high = item.partition("-")
        ids.extend(range(int(low), int(high or low) + 1))
    return ids


def bound_cpus(env: Mapping[str, str]) -> list[int] | None:
    """The CPUs an OpenMP environment, as vLLM's CPU executor writes it, binds to; None
    when it binds to none (or in a form this does not read: the runtime's own then)."""
    patterns = [("OMP_PLACES", r"^\{([\d,\s-]+)\}$"),  # one place: "{0,1,2}"
                ("GOMP_CPU_AFFINITY", r"^([\d,\s-]+)$"),  # "0 1 2"
                ("KMP_AFFINITY", r"proclist=\[([\d,\s-]+)\]")]
    for name, pattern in patterns:
        if (match := re.search(pattern, env.get(name, "").strip())) is not None:
            return _ids(match.group(1))
    return None


def _apply_openmp_env() -> None:
    import torch

    if cpus := bound_cpus(os.environ):
        os.sched_setaffinity(0, cpus)  # this (the only) thread; later threads inherit it
    if (threads := os.environ.get("OMP_NUM_THREADS", "")).isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def install_environment(env: Mapping[str, str]) -> None:
    """Make os.environ `env` in a forked process, writing the changed keys only: emptying
    it first would keep vLLM's setproctitle from naming the process ("VLLM::EngineCore"),
    which tools look for."""
    for key in os.environ.keys() - env.keys():
        del os.environ[key]
    for key, value in env.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def preload() -> None:
    """Import here what the forkserver preloads (PRELOAD), but for the module that would
    tie this process to its parent."""
    for name in PRELOAD:
        if name != _SPAWNED_ONLY:
            importlib.import_module(name)


class _Lifelined:
    """A process that ends with the daemon (lifeline.py), watching from its first step."""

    _daemon_pid: int

    def start(self) -> None:
        self._daemon_pid = lifeline.daemon_pid()
        super().start()  # type: ignore[misc]

    def run(self) -> None:
        lifeline.hold(self._daemon_pid)
        super().run()  # type: ignore[misc]


class _Carried(_Lifelined):
    """Takes the parent's environment at start(); the child installs it before run()."""

    _carried_env: dict[str, str]

    def start(self) -> None:
        self._carried_env = dict(os.environ)
        super().start()
        spawn.notify_started()

    def run(self) -> None:
        install_environment(self._carried_env)
        _apply_openmp_env()
        super().run()


class _ForkedProcess(_Carried, mp_context.ForkProcess):
    pass


class _ForkServerProcess(_Carried, mp_context.ForkServerProcess):
    def run(self) -> None:
        _use(_FORK)  # this engine forks its own worker, from its warm interpreter
        super().run()


class _SpawnedProcess(_Lifelined, mp_context.SpawnProcess):
    def run(self) -> None:
        _use(_SPAWN)  # this engine's worker is spawned with a lifeline too
        super().run()


class _ForkContext(mp_context.ForkContext):
    Process = _ForkedProcess  # type: ignore[assignment]


class _ForkServerContext(mp_context.ForkServerContext):
    Process = _ForkServerProcess  # type: ignore[assignment]


class _SpawnContext(mp_context.SpawnContext):
    Process = _SpawnedProcess  # type: ignore[assignment]


_FORK = _ForkContext()
_FORKSERVER = _ForkServerContext()
_SPAWN = _SpawnContext()


def _use(context: Any) -> None:
    for name in _STARTERS:
        module: Any = importlib.import_module(name)
        module.get_mp_context = lambda: context


def use_forkserver() -> None:
    """From now on vLLM starts this process's engines from the warm forkserver (started
    with the first engine), each with a lifeline. Idempotent."""
    _FORKSERVER.set_forkserver_preload(PRELOAD)
    _use(_FORKSERVER)


def fork_now() -> None:
    """Start the forkserver as a fork of this process, once this process has imported what
    the forkserver preloads: torch and vLLM are then imported once per daemon, not twice
    (a tiny daemon's start to /health took 15-16 CPU-s against 25-26 with a spawned
    forkserver on this 2-core machine, docs/operations.md). `lengthwise serve` calls it
    before it starts any thread of its own (a fork copies only the calling thread); the
    engines find it running when they start.
    If it dies, multiprocessing spawns a fresh one at the next engine start (PRELOAD).
    Idempotent."""
    server: Any = forkserver._forkserver  # multiprocessing's own, which engine starts use
    if server._forkserver_pid is not None:
        return
    _FORKSERVER.set_forkserver_preload(PRELOAD)
    resource_tracker.ensure_running()  # as ensure_running does: its fd goes to each child
    preload()
    sys.stdout.flush()
    sys.stderr.flush()
    with socket.socket(socket.AF_UNIX) as listener:
        address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]
        listener.bind(address)
        if not util.is_abstract_socket_namespace(address):  # type: ignore[attr-defined]
            os.chmod(address, 0o600)
        listener.listen()
        # Every process that uses the server holds the write end of "alive"; the server
        # ends at its EOF (or with this daemon: its lifeline).
        alive_r, alive_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the forkserver
            try:
                _close_fds_but(listener.fileno(), alive_r)  # as if spawned with just these
                lifeline.hold(os.getppid())
                forkserver.main(listener.fileno(), alive_r, [])
            finally:
                os._exit(0)  # never this daemon's atexit handlers
        os.close(alive_r)
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_w
    server._forkserver_pid = pid


def _close_fds_but(*keep: int) -> None:
    for name in os.listdir("/proc/self/fd"):
        if (fd := int(name)) > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:  # the listing's own, already closed
                pass


def use_spawn() -> None:
    """From now on vLLM spawns this process's CPU engines as it does itself, each with a
    lifeline (start_method = "spawn"). Idempotent."""
    _use(_SPAWN)
