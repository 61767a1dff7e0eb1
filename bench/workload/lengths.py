"""Prompts and true output lengths for a workload (see bench/workload/spec.py for the flags).

ShareGPT: one answered user turn per conversation (its first), from the split the reserved-
split rule gives (predictor/dataset.py); answer length counted under the serving tokenizer.
`dev` is the hold-out of the training side (`predictor.dataset.is_dev`, which `predictor train`
never trains on), `train` the whole training side (dev included: mostly in-sample), `test`
the reserved split. Records: the predictor's JSONL ({"messages", "output_tokens"}) or
vLLM-bench custom JSONL ({"prompt", "output_tokens"}). Trace: the trace's token counts with
synthetic prompt text. Lognormal: ShareGPT-like synthetic lengths with synthetic text.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

import msgspec
import numpy as np

from bench.workload.arrivals import read_trace, trace_window
from bench.workload.spec import DEFAULT_TOKENIZER, LENGTHS, Message, WorkloadSpec

# ShareGPT-like log-normal fit (GPT-3.5 answers): (log median, log std) in tokens. Output
# median ~180, mean ~300, p99 ~1,850.
LOGNORMAL_PROMPT = (math.log(150.0), 1.0)
LOGNORMAL_OUTPUT = (math.log(180.0), 1.0)
Shape = tuple[list[Message], int, int]  # messages, prompt tokens, output tokens
# A prompt and its answer length, or the answer text whose tokens are counted when drawn.
Candidate = tuple[list[Message], float | str]
# Words that are one token each (leading space) in the SmolLM2 tokenizer: n of them make an
# n-token prompt, and random choice keeps prompts from sharing cached prefixes.
_WORDS = ["the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be", "by", "at", "this", "are", "from", "or", "have", "an", "they", "which", "one", "you", "were", "all", "we", "can", "there", "has", "more", "their", "if", "will", "about", "time", "so", "would", "what", "up", "when", "some", "into", "out", "them", "only", "other", "new", "these", "also", "than", "then", "any", "like", "most", "people", "first", "over", "such", "our", "after", "very", "may", "year", "world", "state", "even", "well", "know", "good", "make", "much", "made", "work", "long", "way", "back", "great", "where", "water", "little", "see", "day", "right", "think"]


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
    if kind == "sharegpt" and arg in ("train", "dev", "test"):
        candidates: list[Candidate] = _sharegpt(arg)
    elif kind == "records" and arg:
        candidates = list(_records(Path(arg)))
    elif kind == "trace" and arg:
        return _trace(Path(arg), spec)
    elif kind == "lognormal" and not arg:
        return _lognormal(spec)
    else:
        raise ValueError(f"unknown lengths {spec.lengths!r}: {LENGTHS}")
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
    """First answered turns of `split`'s conversations. For dev, prompts that are also the
    first turn of a conversation the predictor trained on (ShareGPT repeats "hello" and
    copy-pasted questions: ~10 % of dev's) are dropped, so dev is unseen text too."""
    from predictor.dataset import (
        Split,
        is_dev,
        iter_conversations,
        load_sharegpt_text,
        split_of,
        turns_of,
    )

    want = Split.TEST if split == "test" else Split.TRAIN
    pairs: list[Candidate] = []
    trained: set[tuple[tuple[str, str], ...]] = set()  # first-turn prompts trained on
    for conv in iter_conversations(load_sharegpt_text()):
        cid = conv.get("id")
        if not isinstance(cid, str) or split_of(cid) is not want:
            continue
        first = next(iter(turns_of(conv)), None)  # whole histories overflow a 2k context
        if first is None:
            continue
        messages = [Message(m.role, m.content) for m in first[0]]
        if split == "dev" and not is_dev(cid):  # the rule `predictor train` holds dev out by
            trained.add(_key(messages))
            continue
        pairs.append((messages, first[1]))
    return [p for p in pairs if _key(p[0]) not in trained]


def _key(messages: list[Message]) -> tuple[tuple[str, str], ...]:
    return tuple((m.role, m.content) for m in messages)


@lru_cache(maxsize=1)
def _counter():  # type: ignore[no-untyped-def]
    # Answer lengths are counted under SmolLM2's tokenizer, which tiny-llama shares.
    from predictor.dataset import TokenCounter

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
    return _synthetic([(c, float(g)) for _, c, g in picked], spec)


def _lognormal(spec: WorkloadSpec) -> list[Shape]:
    rng = np.random.default_rng([spec.seed, 3])
    prompts = np.clip(np.round(rng.lognormal(*LOGNORMAL_PROMPT, spec.num)), 1, 4096)
    outputs = np.maximum(np.round(rng.lognormal(*LOGNORMAL_OUTPUT, spec.num)), 1)
    return _synthetic([(int(p), float(o)) for p, o in zip(prompts, outputs, strict=True)], spec)


def _synthetic(pairs: list[tuple[int, float]], spec: WorkloadSpec) -> list[Shape]:
    """(context tokens, output tokens) -> prompts of synthetic text of that many tokens."""
    overhead = prompt_tokens([Message("user", "")], spec.tokenizer)
    rng = np.random.default_rng([spec.seed, 4])
    shapes: list[Shape] = []
    for context, generated in pairs:
        body = max(min(context, spec.max_input, spec.max_model_len - 2) - overhead, 1)
        text = synthetic_text(body, rng)
        p = body + overhead
        shapes.append(([Message("user", text)], p, fit_output(generated, p, spec)))
    return shapes


def synthetic_text(num_tokens: int, rng: np.random.Generator) -> str:
    """Prompt text of exactly num_tokens tokens (SmolLM2 tokenizer), seeded."""
    picks = rng.integers(0, len(_WORDS), max(num_tokens, 1))
    return "".join(" " + _WORDS[i] for i in picks)


def fit_output(tokens: float, prompt_tokens: int, spec: WorkloadSpec) -> int:
    """Scaled, capped output length that still fits the context."""
    out = max(round(tokens * spec.scale), 1)
    if spec.cap > 0:
        out = min(out, spec.cap)
    return max(min(out, spec.max_model_len - prompt_tokens - 1), 1)
