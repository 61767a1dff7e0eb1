from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.support import DaemonProcess, openai_client


@pytest.fixture
def client(smollm2_daemon: DaemonProcess) -> Iterator[openai.OpenAI]:
    """An openai client on the session's SmolLM2 daemon for one test, closed after it
    (tests.support.openai_client says why). test_anthropic_client has its own, Anthropic's.
    tests/conftest.py puts a test file in the SmolLM2 daemon's worker by the name
    `smollm2_daemon` in its source, not by this fixture: the files that use it name both."""
    with openai_client(smollm2_daemon) as made:
        yield made
