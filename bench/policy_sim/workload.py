"""Seeded workloads for the policy simulator: arrivals near capacity, heavy-tailed lengths,
and predictions that are the truth with log-normal noise of a chosen rank quality."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from daemon.core.costmodel import CostModel

AZURE_CONV = Path("/work/shared/data/azure_llm_2023_conv.csv")
# ShareGPT-like (GPT-3.5 answers): median ~180 tokens, log-std 1.0 -> mean ~300, p99 ~1,850.
SHAREGPT_OUT = (math.log(180.0), 1.0)
SHAREGPT_IN = (math.log(150.0), 1.0)


@dataclass(frozen=True, slots=True)
class Request:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int  # true length (the simulated model stops there)
    predicted_tokens: float  # what the length predictor would say


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    num: int = 2000
    load: float = 0.9  # offered load as a fraction of the estimated capacity
    arrivals: str = "gamma"  # "poisson" | "gamma"
    cv: float = 2.0  # gamma inter-arrival coefficient of variation (1 = Poisson)
    lengths: str = "sharegpt"  # "sharegpt" (log-normal fit) | "azure" (conv trace pairs)
    tau: float = 0.5  # Kendall tau of predictions vs true lengths (1 = perfect)
    max_tokens: int = 2048
    seed: int = 0


def sigma_for_tau(tau: float, log_std: float) -> float:
    """Noise std (log space) whose predictions reach Kendall tau `tau`: for jointly normal
    logs, tau = (2/pi) asin(rho) with rho = s / sqrt(s^2 + sigma^2)."""
    if tau >= 1.0:
        return 0.0
    rho = math.sin(math.pi * max(tau, 1e-6) / 2)
    return log_std * math.sqrt(1.0 / rho**2 - 1.0)


def _lengths(spec: WorkloadSpec, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if spec.lengths == "azure":
        with AZURE_CONV.open() as f:
            rows = [(int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in csv.DictReader(f)]
        pick = rng.integers(0, len(rows), spec.num)
        prompts = np.array([rows[i][0] for i in pick])
        outputs = np.array([rows[i][1] for i in pick])
    elif spec.lengths == "sharegpt":
        prompts = rng.lognormal(*SHAREGPT_IN, spec.num)
        outputs = rng.lognormal(*SHAREGPT_OUT, spec.num)
    else:
        raise ValueError(f"unknown lengths {spec.lengths!r}")
    prompts = np.clip(np.round(prompts), 1, 4096).astype(int)
    outputs = np.clip(np.round(outputs), 1, spec.max_tokens).astype(int)
    return prompts, outputs


def capacity_rps(prompts: np.ndarray, outputs: np.ndarray, cost: CostModel, executors: int,
                 max_running: int) -> float:
    """Requests per second the executors sustain with every slot busy (cost-model work)."""
    work = [cost.prefill_s(p) + cost.decode_share_s(p, o, max_running)
            for p, o in zip(prompts, outputs, strict=True)]
    return executors / float(np.mean(work))


def make_workload(spec: WorkloadSpec, cost: CostModel, executors: int,
                  max_running: int) -> list[Request]:
    rng = np.random.default_rng(spec.seed)
    prompts, outputs = _lengths(spec, rng)
    rate = spec.load * capacity_rps(prompts, outputs, cost, executors, max_running)
    if spec.arrivals == "poisson":
        gaps = rng.exponential(1.0 / rate, spec.num)
    elif spec.arrivals == "gamma":
        shape = 1.0 / spec.cv**2
        gaps = rng.gamma(shape, 1.0 / (rate * shape), spec.num)
    else:
        raise ValueError(f"unknown arrivals {spec.arrivals!r}")
    sigma = sigma_for_tau(spec.tau, float(np.std(np.log(outputs))))
    predicted = outputs * np.exp(rng.normal(0.0, sigma, spec.num))
    arrivals = np.cumsum(gaps) - gaps[0]
    return [Request(float(a), int(p), int(o), float(max(q, 1.0)))
            for a, p, o, q in zip(arrivals, prompts, outputs, predicted, strict=True)]
