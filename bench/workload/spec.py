"""What a workload is: its spec (the flags every bench command shares) and its requests."""

from __future__ import annotations

import argparse
import sys

import msgspec

DEFAULT_TOKENIZER = "models/smollm2-135m-instruct"

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
