"""kvstore through the real daemon: alise preempts a long job for a short one, the long
job's KV is offloaded to kvstore at the abort and loaded back at its resume, and its greedy
answer is the uninterrupted run's (quantization "none").

SmolLM2 in float32, not the tiny model: the tiny random model repeats one token whatever
its KV (" observ observ ...", tried on eight prompts), so its text cannot tell a right
load from a wrong one, and the daemon returns no logprobs; the connector's own test
checks the tiny model's logprobs (tests/kvstore/test_connector.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.support import BENCH_KNOBS, ROOT, DaemonProcess, config_text, free_port

pytestmark = pytest.mark.engine

BLOCK = 128  # the CPU engine's KV block, tokens
# ~340 prompt tokens (two whole blocks and more, so the store has something to hold) of a
# pattern whose continuation depends on every line before it.
PROMPT = "".join(f"{n}. {n} times {n + 3} is {n * (n + 3)}.\n" for n in range(1, 31))
LONG_TOKENS = 40
CUT_AFTER = 24  # tokens the long job streams before the short one arrives
# The engine runs one job at a time; prefix caching is off, so every cached token a
# resumed job reports came from kvstore. Every job gets the fallback prediction capped by
# its budget (no predictor), so the 4-token job is the short one for alise.
DTYPE = 'vllm_args = { dtype = "float32" }'
VLLM_ARGS = 'vllm_args = { dtype = "float32", enable_prefix_caching = false }'
EXTRA = f"""
[scheduler.aging]
slowdown = 50.0
[policies.alise]
offload = true
max_resident_jobs = 0
[kvstore]
enabled = true
quantization = "none"
capacity_bytes = 67108864
[predictor]
path = "none"
iterative_path = "none"
[costmodel]
profile = "{ROOT / 'bench' / 'profiles' / 'smollm2-135m-cpu.json'}"
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, smollm2_model: Path
           ) -> Iterator[DaemonProcess]:
    folder = tmp_path_factory.mktemp("kvstore-daemon")
    text = config_text(smollm2_model, free_port(), max_running=1, max_num_seqs=2,
                       policy="alise", dtype="float32", extra=EXTRA)
    (folder / "lengthwise.toml").write_text(text.replace(DTYPE, VLLM_ARGS, 1))
    # max_resident_jobs is a benchmark knob (alise's tuning)
    proc = DaemonProcess(folder / "lengthwise.toml", folder / "daemon.log", BENCH_KNOBS)
    try:
        proc.wait_ready()
        yield proc
    finally:
        assert proc.stop() == 0, proc.log()


def _complete(base_url: str, prompt: str, max_tokens: int,
              streaming: threading.Event | None = None, after: int = 0) -> str:
    """Greedy completion, streamed; sets `streaming` after `after` chunks."""
    body = {"model": "smollm2-135m-instruct", "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True, "stream": True}
    pieces: list[str] = []
    with httpx.stream("POST", base_url + "/v1/completions", json=body,
                      timeout=120.0) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = httpx.Response(200, content=line[6:]).json()
            if chunk["choices"]:
                pieces.append(chunk["choices"][0]["text"])
            if streaming is not None and len(pieces) >= after:
                streaming.set()
    return "".join(pieces)


def test_preempted_job_resumes_from_kvstore_with_the_uninterrupted_answer(
        daemon: DaemonProcess) -> None:
    url = daemon.base_url
    alone = _complete(url, PROMPT, LONG_TOKENS)
    assert "31. 31 times 34 is" in alone  # a real continuation, context-dependent
    assert daemon.metric("lengthwise_resume_total") == 0

    streaming = threading.Event()
    with ThreadPoolExecutor(2) as pool:
        long = pool.submit(_complete, url, PROMPT, LONG_TOKENS, streaming, CUT_AFTER)
        assert streaming.wait(60)
        short = pool.submit(_complete, url, "The capital of France is", 4)
        assert short.result(timeout=60)
        assert long.result(timeout=120) == alone
    assert daemon.metric("lengthwise_preemptions_total") >= 1, daemon.log()

    deadline = time.monotonic() + 10  # engine stats arrive with the engine's next step
    while daemon.metric("lengthwise_kvstore_loaded_tokens_total") == 0:
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.2)
    saved = daemon.metric("lengthwise_kvstore_saved_tokens_total")
    loaded = daemon.metric("lengthwise_kvstore_loaded_tokens_total")
    resumes = daemon.metric("lengthwise_resume_total")
    recomputed = daemon.metric("lengthwise_resume_recomputed_tokens_total")
    # The preempted context (prompt + >= CUT_AFTER tokens: at least 2 blocks), its partial last
    # block included.
    assert saved >= 2 * BLOCK and loaded >= 2 * BLOCK
    assert resumes >= 1
    # Every resume here is of the offloaded job (the `kv` label), and each prefills only
    # its last token, or up to a block in the rare case the engine had run past a block
    # boundary the daemon's tokens do not reach before the abort (docs/kvstore.md).
    lines = httpx.get(daemon.base_url + "/metrics", timeout=5).text.splitlines()
    assert sum(float(line.rsplit(" ", 1)[1]) for line in lines
               if line.startswith("lengthwise_resume_total{") and 'kv="offloaded"' in line
               ) == resumes, daemon.log()
    assert 0 < recomputed <= resumes * BLOCK
    # The resumed context: the prompt and the >= CUT_AFTER tokens generated before the preemption.
    assert daemon.metric("lengthwise_resume_context_tokens_total") >= loaded + recomputed
    assert daemon.metric("lengthwise_kvstore_bytes") > 0
    assert daemon.metric("lengthwise_kvstore_evicted_tokens_total") == 0
