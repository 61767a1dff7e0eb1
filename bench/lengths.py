"""Prompts and true output lengths for a workload (see bench/workload.py for the flags).

ShareGPT: one answered user turn per conversation (its first), from the split the reserved-
split rule gives (predictor/split.py); answer length counted under the serving tokenizer.
Records: the predictor's JSONL ({"messages", "output_tokens"}) or vLLM-bench custom JSONL
({"prompt", "output_tokens"}). Trace: the trace's token counts with synthetic prompt text.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

import msgspec
import numpy as np

from bench.workload import (
    Message,
    WorkloadSpec,
    fit_output,
    read_trace,
    synthetic_text,
    trace_window,
)

Shape = tuple[list[Message], int, int]  # messages, prompt tokens, output tokens
# A prompt and its answer length, or the answer text whose tokens are counted when drawn.
Candidate = tuple[list[Message], float | str]


@lru_cache(maxsize=4)
def _chat_tokenizer(path: str):  # type: ignore[no-untyped-def]
    from daemon.tokenizer import Tokenizer

    return Tokenizer(path)


def prompt_tokens(messages: list[Message], tokenizer: str) -> int:
    """Tokens of the prompt the server builds: the chat template applied to the messages."""
    tok = _chat_tokenizer(tokenizer)
    return len(tok.encode_chat([{"role": m.role, "content": m.content} for m in messages]))


def draw_lengths(spec: WorkloadSpec) -> list[Shape]:
    kind, _, arg = spec.lengths.partition(":")
    if kind == "sharegpt" and arg in ("train", "test"):
        candidates: list[Candidate] = _sharegpt(arg)
    elif kind == "records" and arg:
        candidates = list(_records(Path(arg)))
    elif kind == "trace" and arg:
        return _trace(Path(arg), spec)
    else:
        raise ValueError(f"unknown lengths {spec.lengths!r}: "
                         "sharegpt:train|sharegpt:test|records:PATH|trace:PATH")
    return _sample(candidates, spec)


def _sample(candidates: list[Candidate], spec: WorkloadSpec) -> list[Shape]:
    """Seeded draw without replacement (with replacement once exhausted); prompts over
    max_input tokens are skipped, so they are tokenized only as far as the draw goes."""
    if not candidates:
        raise ValueError(f"{spec.lengths}: no prompts")
    rng = np.random.default_rng([spec.seed, 3])
    out: list[Shape] = []
    order = iter(rng.permutation(len(candidates)))
    while len(out) < spec.num:
        i = next(order, None)
        if i is None:
            if not out:
                raise ValueError(f"{spec.lengths}: no prompt fits --max-input {spec.max_input}")
            order = iter(rng.permutation(len(candidates)))
            continue
        messages, length = candidates[int(i)]
        p = prompt_tokens(messages, spec.tokenizer)
        if p > min(spec.max_input, spec.max_model_len - 2):  # room for one output token
            continue
        if isinstance(length, str):  # an answer text: count it now, only if drawn
            length = float(_counter().count_batch([length])[0])
        out.append((messages, p, fit_output(length, p, spec)))
    return out


def _sharegpt(split: str) -> list[Candidate]:
    from predictor.sharegpt import iter_conversations, load_sharegpt_text, turns_of
    from predictor.split import Split, split_of

    want = Split(split)
    pairs: list[Candidate] = []
    for conv in iter_conversations(load_sharegpt_text()):
        cid = conv.get("id")
        if not isinstance(cid, str) or split_of(cid) is not want:
            continue
        for messages, response, _ in turns_of(conv):
            pairs.append(([Message(m.role, m.content) for m in messages], response))
            break  # first answered turn only: whole histories overflow a 2k context
    return pairs


@lru_cache(maxsize=1)
def _counter():  # type: ignore[no-untyped-def]
    # Answer lengths are counted under SmolLM2's tokenizer, which tiny-llama shares.
    from bench.workload import DEFAULT_TOKENIZER
    from predictor.outtok import TokenCounter

    return TokenCounter(DEFAULT_TOKENIZER)


class _Line(msgspec.Struct):
    output_tokens: float
    messages: list[Message] | None = None
    prompt: str | None = None


def _records(path: Path) -> Iterator[Candidate]:
    decoder = msgspec.json.Decoder(_Line)
    with path.open("rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            rec = decoder.decode(line)
            if rec.messages:
                yield list(rec.messages), rec.output_tokens
            elif rec.prompt is not None:
                yield [Message("user", rec.prompt)], rec.output_tokens
            else:
                raise ValueError(f"{path}:{n}: needs 'messages' or 'prompt'")


def _trace(path: Path, spec: WorkloadSpec) -> list[Shape]:
    rows = read_trace(path)
    start = trace_window(len(rows), spec.num, spec.seed)
    picked = [rows[(start + k) % len(rows)] for k in range(spec.num)]
    overhead = prompt_tokens([Message("user", "")], spec.tokenizer)
    rng = np.random.default_rng([spec.seed, 4])
    shapes: list[Shape] = []
    for _, context, generated in picked:
        body = max(min(context, spec.max_input, spec.max_model_len - 2) - overhead, 1)
        text = synthetic_text(body, rng)
        p = body + overhead
        shapes.append(([Message("user", text)], p, fit_output(generated, p, spec)))
    return shapes
