from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration import test_differential, test_differential_messages
from tests.integration.test_differential import Answers, collect


@pytest.fixture(scope="session")
def answers(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Answers:
    """vLLM's server and the daemon on every differential suite's requests, once."""
    suites = [test_differential, test_differential_messages]
    return collect(tmp_path_factory.mktemp("differential"), tiny_model, suites)
