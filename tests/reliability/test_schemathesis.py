"""A bounded schemathesis run against the live daemon on the real tiny engine: no 5xx, status
codes and content types as /openapi.json declares them, invalid data refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import DaemonProcess, config_text, free_port

pytestmark = pytest.mark.engine

SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,"
          "response_schema_conformance,negative_data_rejection")


def test_schemathesis_finds_nothing(tmp_path: Path, tiny_model: Path) -> None:
    config = tmp_path / "lengthwise.toml"
    # A short context bounds the prompts and the outputs a request asks for, and 4 tokens
    # those that ask nothing (~40 ms each, not ~400): the coverage phase sends ~7,100
    # requests, ~340 of which reach the engine; the fuzzing phase adds 5 random examples
    # per operation (20 took 19 s more on a quiet machine, 5 about 5 s).
    text = config_text(tiny_model, free_port(), max_running=4,
                       extra="default_max_tokens = 4").replace(
        "max_model_len = 2048", "max_model_len = 48")
    config.write_text(text)
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    try:
        daemon.wait_ready()
        run = subprocess.run(
            [str(SCHEMATHESIS), "run", daemon.base_url + "/openapi.json", "--max-examples", "5",
             "--seed", "7", "--workers", "1", "--no-shrink", "--checks", CHECKS,
             "--request-timeout", "60", "--phases", "coverage,fuzzing",
             # The render endpoints take their endpoints' bodies through the same
             # validation: 2,098 of 7,161 cases, a third of the run (41 s against 28 s
             # alone) for no schema of their own (their answers: test_differential.py)
             "--exclude-path-regex", "/render$"],
            check=False, capture_output=True, text=True, timeout=400, cwd=tmp_path)
        assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
        assert " passed" in run.stdout and "failed" not in run.stdout.split("SUMMARY")[-1]
    finally:
        assert daemon.stop() == 0, daemon.log()
