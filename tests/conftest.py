from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import SMOLLM2, TINY, DaemonProcess, config_text, free_port


def _require(model: Path) -> None:
    if not (model / "config.json").exists():
        pytest.fail(f"{model} is missing: run `make models` (make test does it)")


@pytest.fixture(scope="session")
def smollm2_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """The real daemon on the real vLLM engine and the default model, once per run."""
    _require(SMOLLM2)
    folder = tmp_path_factory.mktemp("smollm2-daemon")
    config = folder / "lengthwise.toml"
    config.write_text(config_text(SMOLLM2, free_port(), max_running=4, max_num_seqs=8))
    daemon = DaemonProcess(config, folder / "daemon.log")
    try:
        daemon.wait_ready()
        yield daemon
    finally:
        code = daemon.stop()
        assert code == 0, daemon.log()


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    _require(TINY)
    return TINY


@pytest.fixture(scope="session")
def smollm2_model() -> Path:
    _require(SMOLLM2)
    return SMOLLM2
