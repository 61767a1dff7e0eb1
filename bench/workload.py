"""Seeded benchmark workloads: when each request arrives, what it asks, how long its answer is.

Arrivals: Poisson, Gamma (bursty, by rate and CV) or the timestamps of a trace rescaled to a
target rate. Lengths: ShareGPT prompts with their real answer lengths (split by the reserved-
split rule), predictor records / vLLM-bench JSONL, or a trace's token counts with synthetic
prompt text of that length. The same spec and seed give the same requests, byte for byte.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import sys
from pathlib import Path

import msgspec
import numpy as np

DEFAULT_TOKENIZER = "models/smollm2-135m-instruct"
# Words that are one token each (leading space) in the SmolLM2 tokenizer: n of them make an
# n-token prompt, and random choice keeps prompts from sharing cached prefixes.
_WORDS = ["the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be", "by", "at", "this", "are", "from", "or", "have", "an", "they", "which", "one", "you", "were", "all", "we", "can", "there", "has", "more", "their", "if", "will", "about", "time", "so", "would", "what", "up", "when", "some", "into", "out", "them", "only", "other", "new", "these", "also", "than", "then", "any", "like", "most", "people", "first", "over", "such", "our", "after", "very", "may", "year", "world", "state", "even", "well", "know", "good", "make", "much", "made", "work", "long", "way", "back", "great", "where", "water", "little", "see", "day", "right", "think"]


LENGTHS = ("sharegpt:dev (held out of the shipped predictor's training: the default) | "
           "sharegpt:train (in-sample) | sharegpt:test (reserved: final reports only) | "
           "records:PATH | trace:PATH | lognormal (synthetic ShareGPT-like lengths)")


class Message(msgspec.Struct, frozen=True):
    role: str
    content: str


class Request(msgspec.Struct, frozen=True):
    index: int
    arrival_s: float  # offset from the start of the run, seconds
    messages: list[Message]
    prompt_tokens: int  # of the chat-templated prompt, under the serving tokenizer
    output_tokens: int  # true (forced) answer length


class WorkloadSpec(msgspec.Struct, frozen=True, kw_only=True):
    arrivals: str = "poisson"  # poisson | gamma | trace:PATH
    rate: float = 1.0  # req/s; for a trace, its timestamps are rescaled to this mean rate
    cv: float = 1.0  # Gamma inter-arrival coefficient of variation (1 = Poisson)
    num: int = 100
    lengths: str = "sharegpt:dev"  # see LENGTHS
    scale: float = 1.0  # output lengths are multiplied by this ...
    cap: int = 0  # ... then capped at this (0 = no cap)
    seed: int = 0
    max_input: int = 1024  # ShareGPT/records prompts longer than this are skipped; traces cut
    max_model_len: int = 2048  # prompt + output must fit: outputs are cut to the room left
    tokenizer: str = DEFAULT_TOKENIZER


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The workload flags shared by `bench run`, `bench compare` and `sim`."""
    p.add_argument("--arrivals", default="poisson", help="poisson | gamma | trace:PATH")
    p.add_argument("--rate", type=float, default=1.0, help="requests per second")
    p.add_argument("--cv", type=float, default=1.0, help="Gamma coefficient of variation")
    p.add_argument("--num", type=int, default=100, help="number of requests")
    p.add_argument("--lengths", default="sharegpt:dev", help=LENGTHS)
    p.add_argument("--scale", type=float, default=1.0, help="multiply output lengths")
    p.add_argument("--cap", type=int, default=0, help="cap output lengths (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-input", type=int, default=1024, help="prompt token limit")
    p.add_argument("--max-model-len", type=int, default=2048, help="context length")
    p.add_argument("--tokenizer", default=DEFAULT_TOKENIZER, help="serving model folder")


def spec_from_args(args: argparse.Namespace, rate: float | None = None) -> WorkloadSpec:
    return WorkloadSpec(arrivals=args.arrivals, rate=args.rate if rate is None else rate,
                        cv=args.cv, num=args.num, lengths=args.lengths, scale=args.scale,
                        cap=args.cap, seed=args.seed, max_input=args.max_input,
                        max_model_len=args.max_model_len, tokenizer=args.tokenizer)


def sample_label(spec: WorkloadSpec) -> str:
    """Whether the shipped predictor saw these prompts: the label every JSON output carries."""
    return {"sharegpt:dev": "held-out", "sharegpt:train": "in-sample",
            "sharegpt:test": "reserved-test"}.get(spec.lengths, "external")


def warn_sample(spec: WorkloadSpec) -> None:
    """Once per command: figures on training prompts say nothing about users' requests."""
    label = sample_label(spec)
    if label == "in-sample":
        print("warning: --lengths sharegpt:train holds the prompts the shipped predictor was "
              "trained on: these figures are in-sample (use sharegpt:dev)", file=sys.stderr)
    elif label == "reserved-test":
        print("note: sharegpt:test is the reserved split, for final reports only: never tune "
              "or choose on it", file=sys.stderr)


def build(spec: WorkloadSpec) -> list[Request]:
    """The workload: arrival times and lengths are drawn from independent seeded streams,
    so changing the rate keeps the same prompts (runs at several rates stay comparable)."""
    from bench.lengths import draw_lengths  # heavy imports (tokenizers) only when needed

    times = arrival_times(spec)
    shapes = draw_lengths(spec)
    return [Request(i, float(t), msgs, p, o)
            for i, (t, (msgs, p, o)) in enumerate(zip(times, shapes, strict=True))]


def at_rate(requests: list[Request], rate: float, new_rate: float) -> list[Request]:
    """The same requests at another mean rate. Exact for every arrival kind: Poisson and
    Gamma gaps are drawn at scale 1/rate and trace times are rescaled to it, so build(spec
    at new_rate) gives these times too, without drawing and tokenizing the prompts again."""
    k = rate / new_rate
    return [msgspec.structs.replace(r, arrival_s=r.arrival_s * k) for r in requests]


def arrival_times(spec: WorkloadSpec) -> np.ndarray:
    rng = np.random.default_rng([spec.seed, 1])
    if spec.num <= 0:
        return np.zeros(0)
    if spec.rate <= 0:
        raise ValueError("--rate must be > 0")
    kind, _, path = spec.arrivals.partition(":")
    if kind == "poisson":
        gaps = rng.exponential(1.0 / spec.rate, spec.num)
    elif kind == "gamma":
        shape = 1.0 / spec.cv**2
        gaps = rng.gamma(shape, 1.0 / (spec.rate * shape), spec.num)
    elif kind == "trace" and path:
        return _trace_times(Path(path), spec)
    else:
        raise ValueError(f"unknown arrivals {spec.arrivals!r}: poisson | gamma | trace:PATH")
    return np.cumsum(gaps) - gaps[0]  # the first request arrives at t = 0


def trace_window(total: int, num: int, seed: int) -> int:
    """First row of the num consecutive rows a trace contributes; the same for the trace's
    arrivals and lengths, so a trace used for both keeps its rows paired."""
    if num >= total:
        return 0
    return int(np.random.default_rng([seed, 2]).integers(0, total - num + 1))


def read_trace(path: Path) -> list[tuple[float, int, int]]:
    """(seconds since the trace's first row, context tokens, generated tokens) per row."""
    rows = []
    with path.open() as f:
        for row in csv.DictReader(f):
            rows.append((_seconds(row["TIMESTAMP"]), int(row["ContextTokens"]),
                         int(row["GeneratedTokens"])))
    if not rows:
        raise ValueError(f"{path}: empty trace")
    t0 = rows[0][0]
    return [(t - t0, c, g) for t, c, g in rows]


def _seconds(stamp: str) -> float:
    # "2023-11-16 18:17:03.9799600": 7 fractional digits, more than fromisoformat takes.
    whole, _, frac = stamp.strip().partition(".")
    base = dt.datetime.fromisoformat(whole).replace(tzinfo=dt.UTC).timestamp()
    return base + (float("0." + frac) if frac else 0.0)


def _trace_times(path: Path, spec: WorkloadSpec) -> np.ndarray:
    rows = read_trace(path)
    start = trace_window(len(rows), spec.num, spec.seed)
    window = rows[start:start + spec.num]
    times = np.array([t for t, _, _ in window]) - window[0][0]
    if len(times) < spec.num:  # a short trace repeats, shifted past its end
        period = times[-1] + (times[-1] / max(len(times) - 1, 1))
        reps = -(-spec.num // len(times))
        times = np.concatenate([times + k * period for k in range(reps)])[:spec.num]
    span = times[-1] - times[0]
    if span > 0 and len(times) > 1:
        times = times * (((len(times) - 1) / span) / spec.rate)  # mean rate -> spec.rate
    return times


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
