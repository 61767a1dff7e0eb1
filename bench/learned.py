"""A cost profile from what a running daemon learned (`lengthwise profile --learned URL`):
its engines' step-time coefficients as its clock fitted them (daemon/core/clock.py, exported
in /metrics as `lengthwise_step_coefficient_seconds{executor,term}`), in the profile file the
simulator (`lengthwise sim --profile`) and `[costmodel] profile` read. So the simulator runs
on the engine the daemon measured while serving, without a profiling run."""

from __future__ import annotations

import statistics
from collections import defaultdict

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.costfile import Profile
from daemon.core.costmodel import TERMS
from daemon.executors.settings import SimConfig


def profile_from_metrics(text: str, name: str, where: str = "a daemon") -> Profile:
    """The mean over executors whose clock learned from any step; max_num_seqs is the
    largest admission cap by count (the engine's under max_running = "auto")."""
    terms: dict[str, dict[str, float]] = defaultdict(dict)
    samples: dict[str, float] = {}
    caps: list[int] = []
    errors: list[float] = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            executor = s.labels.get("executor", "")
            if s.name == "lengthwise_step_coefficient_seconds":
                terms[executor][s.labels["term"]] = s.value
            elif s.name == "lengthwise_step_samples_total":
                samples[executor] = s.value
            elif s.name == "lengthwise_max_running":
                caps.append(int(s.value))
            elif s.name == "lengthwise_step_fit_error":
                errors.append(s.value)
    learned = [executor for executor, count in samples.items() if count > 0]
    if not learned:
        raise ValueError(f"{where} has not learned any engine step yet: serve some traffic")
    sim = SimConfig(**{term: statistics.fmean(terms[ex][term] for ex in learned)
                       for term in TERMS})
    error = f", median fit error {statistics.median(errors):.1%}" if errors else ""
    source = (f"learned by the daemon at {where} from {sum(samples.values()):.0f} engine steps "
              f"of {len(learned)} executor(s){error} (daemon/core/clock.py)")
    return Profile(name=name, source=source, max_num_seqs=max(caps, default=1), sim=sim)


def fetch(url: str, name: str) -> Profile:
    text = httpx.get(url.rstrip("/") + "/metrics", timeout=10).text
    return profile_from_metrics(text, name, url)
