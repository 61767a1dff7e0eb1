"""vLLM's request limits, read from the installed vLLM: the environment variables and
defaults of its `vllm.envs` (VLLM_MAX_N_SEQUENCES, VLLM_MAX_COMPLETION_PROMPTS, ...) and the
constants of its `vllm.sampling_params` (MAX_LOGPROB_TOKEN_IDS), which its OpenAI server
and SamplingParams check before any work. The HTTP layer applies them
(daemon/http/limits.py) with vLLM's words; it gets them from the Service, never from vLLM.

Reading them must not import vLLM: `import vllm.envs` runs vLLM's package __init__, which
imports torch (about 10 s), and a daemon on the simulated engine never imports vLLM. Its
envs module imports only the standard library at its top, so it is loaded from its file
on its own, and a constant is read from its module's source, unless vLLM is imported
already.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from typing import Any

import msgspec

_PRIVATE_NAME = "_lengthwise_vllm_envs"  # the standalone copy's module name


class RequestLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Each field is the vLLM environment variable of the same name (upper case), as the
    installed vLLM reads it."""

    vllm_max_n_sequences: int  # `n` at most (SamplingParams)
    vllm_max_completion_prompts: int  # prompts in one /v1/completions batch
    vllm_max_stop_strings: int  # entries of a `stop` list (its request models)
    vllm_max_num_bad_words: int  # bad_words, as token sequences after tokenizing
    vllm_max_bad_words_total_tokens: int  # their tokens, summed
    max_logprob_token_ids: int  # logprob_token_ids at most (a SamplingParams constant)


def _package() -> Path:
    package = importlib.util.find_spec("vllm")  # finds the package without importing it
    if package is None or not package.submodule_search_locations:
        raise RuntimeError("vLLM is not installed: its request limits cannot be read")
    return Path(next(iter(package.submodule_search_locations)))


def _envs_module() -> Any:
    loaded = sys.modules.get("vllm.envs") or sys.modules.get(_PRIVATE_NAME)
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location(_PRIVATE_NAME, _package() / "envs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[_PRIVATE_NAME] = module
    return module


def _constant(module: str, name: str) -> int:
    """A module-level integer of a vLLM module (`module`: its path in the package)."""
    loaded = sys.modules.get("vllm." + module.replace("/", "."))
    if loaded is not None:
        return int(getattr(loaded, name))
    tree = ast.parse((_package() / f"{module}.py").read_text())
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        elif isinstance(node, ast.Assign):
            targets = node.targets
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            assert isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None
            return int(ast.literal_eval(node.value))
    raise RuntimeError(f"vllm/{module}.py defines no {name}")


def read() -> RequestLimits:
    """The installed vLLM's limits, from this process's environment now."""
    envs = _envs_module()
    return RequestLimits(
        **{name: int(getattr(envs, name.upper()))
           for name in RequestLimits.__struct_fields__ if name.startswith("vllm_")},
        max_logprob_token_ids=_constant("sampling_params", "MAX_LOGPROB_TOKEN_IDS"))
