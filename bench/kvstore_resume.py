"""Preempt -> resume on the real engine, with the KV dropped (recomputed) or offloaded to
kvstore: time to the first resumed token, the connector's own save/load time, and whether
the resumed tokens are the uninterrupted run's (INT8 vs unquantized).

    PYTHONPATH=$PWD .venv/bin/python -m bench.kvstore_resume --quantization int8 --num 12

Prompts: ShareGPT dev hold-out (never trained on), chat-templated, 600-1100 tokens.
Each prompt: an uninterrupted greedy run; a run aborted after --preempt-after tokens and
resumed from prompt + generated tokens with nothing stored (drop: full prefill); the same
aborted with {"kvstore": "offload"} and resumed (the stored whole blocks are loaded).
Prefix caching is off so the only reuse is kvstore's; one request at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from kvstore.trace import read_trace

ROOT = Path(__file__).resolve().parents[1]


def dev_prompts(model: Path, num: int, lo: int, hi: int) -> list[list[int]]:
    from daemon.tokenizer import Tokenizer
    from predictor.dataset import Split, is_dev, sharegpt_pairs

    tokenizer = Tokenizer(str(model))
    prompts: list[list[int]] = []
    for record_id, messages, _ in sharegpt_pairs(Split.TRAIN):
        if not is_dev(record_id):
            continue
        ids = tokenizer.encode_chat([{"role": m.role, "content": m.content} for m in messages])
        if lo <= len(ids) <= hi:
            prompts.append(ids)
            if len(prompts) == num:
                break
    return prompts


def build_engine(args: argparse.Namespace, trace_path: Path) -> Any:
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    transfer = KVTransferConfig(
        kv_connector="LengthwiseConnector", kv_role="kv_both",
        kv_connector_module_path="kvstore.connector", kv_load_failure_policy="recompute",
        kv_connector_extra_config={"trace_path": str(trace_path),
                                   "quantization": args.quantization,
                                   "capacity_bytes": args.capacity_mib << 20})
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return AsyncLLM.from_engine_args(AsyncEngineArgs(
        model=str(args.model), dtype=args.dtype, enforce_eager=True, max_model_len=2048,
        max_num_seqs=1, enable_prefix_caching=False, disable_log_stats=True,
        kv_transfer_config=transfer))


async def run(engine: Any, prompt: list[int], request_id: str, max_tokens: int,
              abort_after: int = 0, offload: bool = False) -> tuple[list[int], float]:
    """(tokens, seconds to the first token); aborted once `abort_after` tokens arrived."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    extra = {"kv_transfer_params": {"kvstore": "offload"}} if offload else None
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                            extra_args=extra)
    started, first, tokens = time.perf_counter(), 0.0, []
    stream = engine.generate(TokensPrompt(prompt_token_ids=prompt), params, request_id)
    async with contextlib.aclosing(stream):
        async for out in stream:
            tokens = list(out.outputs[0].token_ids)
            first = first or time.perf_counter() - started
            if abort_after and len(tokens) >= abort_after:
                break
    return tokens, first


def agreeing_run(got: list[int], want: list[int]) -> int:
    run_length = 0
    for a, b in zip(got, want, strict=False):
        if a != b:
            break
        run_length += 1
    return run_length


async def measure(args: argparse.Namespace, engine: Any, prompts: list[list[int]]
                  ) -> list[dict[str, Any]]:
    rows = []
    total = args.preempt_after + args.resume_tokens
    await run(engine, prompts[0][:64], "warmup", 2)
    for i, prompt in enumerate(prompts):
        reference, ttft_full = await run(engine, prompt, f"ref{i}", total)
        dropped, _ = await run(engine, prompt, f"drop{i}", total, args.preempt_after)
        _, ttft_drop = await run(engine, prompt + dropped, f"dropres{i}",
                                 total - len(dropped))
        kept, _ = await run(engine, prompt, f"off{i}", total, args.preempt_after, offload=True)
        resumed, ttft_store = await run(engine, prompt + kept, f"offres{i}", total - len(kept))
        rows.append({"prompt_tokens": len(prompt), "context_tokens": len(prompt) + len(kept),
                     "ttft_prefill_full_s": ttft_full, "ttft_resume_drop_s": ttft_drop,
                     "ttft_resume_store_s": ttft_store,
                     "first_token_agrees": resumed[:1] == reference[len(kept):len(kept) + 1],
                     "agreeing_run": agreeing_run(resumed, reference[len(kept):]),
                     "resumed_tokens": len(resumed)})
    return rows


def summary(rows: list[dict[str, Any]], trace_path: Path) -> dict[str, Any]:
    applies = [c.detail for c in read_trace(trace_path) if c.hook == "apply"]
    med = statistics.median
    return {
        "resumes": len(rows),
        "context_tokens_median": med(r["context_tokens"] for r in rows),
        "ttft_resume_drop_s_median": med(r["ttft_resume_drop_s"] for r in rows),
        "ttft_resume_store_s_median": med(r["ttft_resume_store_s"] for r in rows),
        # The worker's drops + saves + loads over the run, per offloaded resume.
        "connector_save_load_s_per_resume": sum(a["seconds"] for a in applies) / len(rows),
        "first_token_agreement": sum(r["first_token_agrees"] for r in rows) / len(rows),
        "agreeing_run_mean": statistics.mean(r["agreeing_run"] for r in rows),
        "resume_tokens": rows[0]["resumed_tokens"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=ROOT / "models" / "smollm2-135m-instruct")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--quantization", choices=("int8", "none"), default="int8")
    p.add_argument("--capacity-mib", type=int, default=512)
    p.add_argument("--num", type=int, default=12)
    p.add_argument("--min-prompt", type=int, default=600)
    p.add_argument("--max-prompt", type=int, default=1100)
    p.add_argument("--preempt-after", type=int, default=20)
    p.add_argument("--resume-tokens", type=int, default=20)
    p.add_argument("--json", action="store_true", help="print every resume, not only the summary")
    args = p.parse_args()
    prompts = dev_prompts(args.model, args.num, args.min_prompt, args.max_prompt)
    with tempfile.TemporaryDirectory() as folder:
        trace_path = Path(folder) / "hooks.jsonl"
        engine = build_engine(args, trace_path)
        try:
            rows = asyncio.run(measure(args, engine, prompts))
        finally:
            engine.shutdown()
        if args.json:
            print(json.dumps(rows, indent=1))
        print(json.dumps({"model": args.model.name, "dtype": args.dtype,
                          "quantization": args.quantization, **summary(rows, trace_path)},
                         indent=1))


if __name__ == "__main__":
    main()
