"""A cost profile from what a running daemon learned (`lengthwise profile --learned URL`):
its engines' step-time coefficients as its clock fitted them (daemon/core/clock.py, exported
in /metrics as `lengthwise_step_coefficient_seconds{executor,term}`), in the profile file the
simulator (`lengthwise sim --profile`) and `[costmodel] profile` read. So the simulator runs
on the engine the daemon measured while serving, without a profiling run."""

from __future__ import annotations

import statistics
import threading
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Self

import httpx
import msgspec
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
    sim = _mean_sim([terms[ex] for ex in learned])
    error = f", median fit error {statistics.median(errors):.1%}" if errors else ""
    source = (f"learned by the daemon at {where} from {sum(samples.values()):.0f} engine steps "
              f"of {len(learned)} executor(s){error} (daemon/core/clock.py)")
    return Profile(name=name, source=source, max_num_seqs=max(caps, default=1), sim=sim)


def fetch(url: str, name: str) -> Profile:
    text = httpx.get(url.rstrip("/") + "/metrics", timeout=10).text
    return profile_from_metrics(text, name, url)


def _mean_sim(coefficients: Sequence[Mapping[str, float]]) -> SimConfig:
    """Each step-time term's mean over these sets of coefficients."""
    return SimConfig(**{term: statistics.fmean(c[term] for c in coefficients)  # type: ignore[arg-type]
                        for term in TERMS})


def mean_profile(profiles: Sequence[Profile], name: str) -> Profile:
    """The profiles' coefficient-wise mean (module doc)."""
    sim = _mean_sim([msgspec.structs.asdict(p.sim) for p in profiles])
    source = f"the mean of {len(profiles)} snapshots taken during a run; the last: " + (
        profiles[-1].source)
    return Profile(name=name, source=source,
                   max_num_seqs=max(p.max_num_seqs for p in profiles), sim=sim)


class Sampler:
    """A daemon's learned clock, fetched every `period_s` seconds by a thread while the
    `with` block runs (and once at its end); `profile()` is their mean."""

    def __init__(self, url: str, name: str, period_s: float = 5.0) -> None:
        self.url, self.name, self.period_s = url, name, period_s
        self.snapshots: list[Profile] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="clock-sampler", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self._take()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._take()

    def _take(self) -> None:
        try:
            self.snapshots.append(fetch(self.url, self.name))
        except (ValueError, httpx.HTTPError):  # nothing learned yet; a busy or gone server
            pass

    def profile(self) -> Profile:
        """The mean of the snapshots; ValueError when none was taken."""
        if not self.snapshots:
            raise ValueError(f"no learned clock was fetched from {self.url}")
        return mean_profile(self.snapshots, self.name)
