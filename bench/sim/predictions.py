"""What the simulated daemon predicts: first-estimate predictions per request, and the
optional noisy iterative re-predictor for remaining lengths (isrtf, alise)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from bench import workload
from daemon.core.job import Job
from daemon.core.repredict import RemainingPredictor

PREDICTORS = ("default (the shipped predictor, predictor/models/default) | oracle | "
              "noisy-oracle[:SIGMA] (truth x lognormal, default sigma 0.5) | "
              "noisy-oracle:tau=T (noise giving Kendall tau T) | none | a predictor DIR")


def sigma_for_tau(tau: float, log_std: float) -> float:
    """Noise std (log space) whose predictions reach Kendall tau `tau`: for jointly normal
    logs, tau = (2/pi) asin(rho) with rho = s / sqrt(s^2 + sigma^2)."""
    if tau >= 1.0:
        return 0.0
    rho = math.sin(math.pi * max(tau, 1e-6) / 2)
    return log_std * math.sqrt(1.0 / rho**2 - 1.0)


def noise_sigma(arg: str, truth: Sequence[float]) -> float:
    """'' -> 0.5; 'SIGMA'; 'tau=T' -> the sigma reaching tau T on these lengths."""
    if arg.startswith("tau="):
        return sigma_for_tau(float(arg[4:]), float(np.std(np.log(truth))))
    return float(arg or 0.5)


class Estimate(NamedTuple):
    """A first prediction as the daemon's predictor gives it: the point estimate and the
    upper quantile memory admission reserves for (None where the predictor has none)."""

    tokens: float | None
    upper: float | None = None


def predictions(requests: Sequence[workload.Request], how: str, seed: int,
                quantile: float = 0.5) -> list[Estimate]:
    """One first estimate per request (see PREDICTORS); `quantile`: the level of the upper
    estimate (scheduler.admission_quantile), where the predictor has a quantile head. The
    oracle's upper is the truth too."""
    truth = [float(r.output_tokens) for r in requests]
    kind, _, arg = how.partition(":")
    if kind == "none":
        return [Estimate(None)] * len(requests)
    if kind == "oracle":
        return [Estimate(t, t) for t in truth]
    if kind == "noisy-oracle":
        sigma = noise_sigma(arg, truth)
        noise = np.random.default_rng([seed, 5]).normal(0.0, sigma, len(requests))
        return [Estimate(max(t * math.exp(z), 1.0)) for t, z in zip(truth, noise, strict=True)]
    from predictor.api import PredictInput
    from predictor.loader import default_predictor_path, load_predictor
    from predictor.records import Message

    model = load_predictor(default_predictor_path() if how == "default" else Path(how))
    inputs = [PredictInput(messages=[Message(m.role, m.content) for m in r.messages],
                           num_prompt_tokens=r.prompt_tokens) for r in requests]
    points, upper = model.predict_with_upper(inputs, quantile)
    if upper is None:
        return [Estimate(float(p)) for p in points]
    return [Estimate(float(p), float(u)) for p, u in zip(points, upper, strict=True)]


class NoisyIterativePredictor:
    """Remaining = truth x exp(N(0, sigma_g)), sigma_g = sigma0 / sqrt(1 + g / window): ELIS
    reports the error falling window by window. Deterministic per (seed, job, g), and a
    coroutine: in virtual time it costs nothing."""

    def __init__(self, sigma0: float, window: int, seed: int) -> None:
        self.sigma0, self.window, self.seed = sigma0, window, seed

    async def __call__(self, jobs: Sequence[Job]) -> list[float]:
        return [self._one(job) for job in jobs]

    def _one(self, job: Job) -> float:
        g = job.num_generated_tokens
        left = max((job.true_output_tokens or 0) - g, 1)
        sigma = self.sigma0 / math.sqrt(1.0 + g / self.window)
        digest = hashlib.blake2b(f"{self.seed}/{job.job_id}/{g}".encode(), digest_size=8)
        z = np.random.default_rng(int.from_bytes(digest.digest(), "little")).normal()
        return float(left * math.exp(sigma * z))


def iterative_predictor(how: str, window: int, seed: int) -> RemainingPredictor:
    """'noisy[:SIGMA]' (default sigma 0.5)."""
    kind, _, arg = how.partition(":")
    if kind != "noisy":
        raise ValueError(f"unknown --iterative {how!r}: noisy[:SIGMA]")
    return NoisyIterativePredictor(float(arg or 0.5), window, seed)
