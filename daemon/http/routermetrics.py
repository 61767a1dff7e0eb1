"""What a router reads on /metrics: vLLM's gauge names with vLLM's meaning, plus the
predicted work no engine knows about.

The Gateway API Inference Extension's endpoint picker (llm-d's EPP) scrapes
`vllm:num_requests_waiting`, `vllm:num_requests_running`, `vllm:kv_cache_usage_perc` and
`vllm:cache_config_info` and, when a family has several series, takes the first one that
matches its label selector. So each `vllm:` family here is one series for the whole pod
(labels `model_name`, as vLLM sets it, and `engine="all"`): the pod is what the router
picks; lengthwise places the request on an executor itself. Per-executor detail is in the
`lengthwise_` families, and `lengthwise_predicted_outstanding_tokens` lists its pod total
first for the same reason.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from daemon.core.job import Job, SamplingSpec
from daemon.executors.base import EngineStats
from daemon.service import Service

log = logging.getLogger(__name__)
_LABELS = ["model_name", "engine"]


class RouterCollector(Collector):
    def __init__(self, service: Service) -> None:
        self._service = service  # its config is swapped on reload: read it at scrape time
        self._scheduler = service.scheduler
        self._predictions = service.predictions
        self.recent = service.metrics.recent

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield from self._vllm_families()
        preemptions = CounterMetricFamily("vllm:num_preemptions", "Cumulative number of "
                                          "preemption from the engine.", labels=_LABELS)
        preemptions.add_metric([self._service.config.model.name, "all"],
                               sum(ex.engine_preemptions for ex in self._service.executors))
        yield preemptions
        yield self._outstanding()
        yield GaugeMetricFamily(
            "lengthwise_estimated_wait_seconds", "Estimated seconds until a new request of "
            "median size (recent jobs) would start, under the running policy's order",
            value=self.estimated_wait_s())

    # ---- vLLM's names -------------------------------------------------------------------

    def _engine_stats(self) -> list[EngineStats]:
        return [ex.engine_stats() or EngineStats() for ex in self._service.executors]

    def _vllm_families(self) -> Iterator[GaugeMetricFamily]:
        sched, stats = self._scheduler, self._engine_stats()
        labels = [self._service.config.model.name, "all"]
        # Admitted by the core but not (yet) in an engine's running batch: queued inside
        # the engine, or on their way to it.
        in_batch = min(sum(s.num_running_reqs for s in stats), sched.num_running)
        waiting = GaugeMetricFamily("vllm:num_requests_waiting", "Requests waiting: in "
                                    "lengthwise's queue plus admitted ones not yet in an "
                                    "engine's running batch", labels=_LABELS)
        waiting.add_metric(labels, len(sched.waiting) + sched.num_running - in_batch)
        running = GaugeMetricFamily("vllm:num_requests_running", "Requests in the engines' "
                                    "running batches, as the engines last reported them",
                                    labels=_LABELS)
        running.add_metric(labels, in_batch)
        blocks = sum(s.num_gpu_blocks for s in stats)
        used = sum(s.kv_cache_usage * s.num_gpu_blocks for s in stats)
        kv = GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage of all engines "
                               "(block-weighted). 1 means 100 percent usage.", labels=_LABELS)
        kv.add_metric(labels, used / blocks if blocks else 0.0)
        yield from (waiting, running, kv)
        block_size = max((s.block_size for s in stats), default=0)
        if blocks and block_size:
            info = GaugeMetricFamily("vllm:cache_config_info", "KV cache configuration "
                                     "(all engines: num_gpu_blocks is their sum)",
                                     labels=["block_size", "num_gpu_blocks", *_LABELS])
            info.add_metric([str(block_size), str(blocks), *labels], 1)
            yield info
        per_executor = GaugeMetricFamily("lengthwise_kv_cache_usage_perc", "KV-cache usage "
                                         "one engine reported, 0-1", labels=["executor"])
        for ex, stat in zip(sched.lanes, stats, strict=True):
            per_executor.add_metric([ex.name], stat.kv_cache_usage)
        yield per_executor

    # ---- predicted work -----------------------------------------------------------------

    def expected_remaining(self, job: Job) -> float:
        """Predicted tokens still to come; jobs queued before their prediction (policies
        that do not read predictions) count the fallback estimate, not their whole budget."""
        if job.predicted_output_tokens is None:
            left = self._predictions.fallback_tokens - job.num_generated_tokens
            return float(min(max(left, 1.0), job.num_remaining_budget_tokens))
        return job.predicted_remaining_tokens

    def _outstanding(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            "lengthwise_predicted_outstanding_tokens", "Predicted output tokens still to "
            "generate: executor=\"total\" (listed first) is the pod, \"waiting\" the queue, "
            "and each executor its admitted jobs", labels=["executor"])
        sched = self._scheduler
        per_executor = [(ex.name, sum(self.expected_remaining(job)
                                      for job in ex.running.values()))
                        for ex in sched.lanes]
        queued = sum(self.expected_remaining(job) for job in sched.waiting)
        family.add_metric(["total"], queued + sum(tokens for _, tokens in per_executor))
        family.add_metric(["waiting"], queued)
        for name, tokens in per_executor:
            family.add_metric([name], tokens)
        return family

    def median_job(self) -> tuple[int, float]:
        """(prompt tokens, output tokens) of a median recent job; the predictor's fallback
        length and a 256-token prompt before any job finished."""
        recent = self.recent
        if not recent.output_tokens:
            return 256, self._predictions.fallback_tokens
        return (int(statistics.median(recent.prompt_tokens)),
                float(statistics.median(recent.output_tokens)))

    def seconds_per_token(self) -> float:
        """Per-job decode time per token: one decode step of a full batch (the jobs one
        executor runs together at load) of median-size jobs, on the engines' learned clock
        (daemon/core/clock.py)."""
        policy = self._scheduler.policy
        prompt_tokens, output_tokens = self.median_job()
        batch = policy.batch_hint
        return policy.cost.step_s(0, batch, batch * (prompt_tokens + output_tokens / 2))

    def estimated_wait_s(self) -> float:
        """Fluid estimate: a new median-size job starts once the work ahead of it (running
        jobs' remaining tokens plus waiting jobs the policy ranks before it, promoted ones
        included) has drained through every slot at the recent per-token speed; zero when
        a slot is free for it."""
        sched = self._scheduler
        ahead = self._jobs_ahead()
        slots = sum(sched.estimates.slots(lane) for lane in sched.lanes)
        if sched.num_running + len(ahead) < slots:
            return 0.0
        work = sum(self.expected_remaining(job) for ex in sched.lanes
                   for job in ex.running.values())
        work += sum(self.expected_remaining(job) for job in ahead)
        return work * self.seconds_per_token() / max(slots, 1)

    def _jobs_ahead(self) -> list[Job]:
        sched = self._scheduler
        now = sched.now()
        prompt_tokens, output_tokens = self.median_job()
        probe = Job("lengthwise-wait-probe", [0] * prompt_tokens,
                    SamplingSpec(max_tokens=max(int(output_tokens), 1)), arrival_time=now,
                    predicted_output_tokens=output_tokens, enqueue_time=now)
        try:
            key = (sched.waiting.rank(probe), sched.policy.order_key(probe))
        except Exception:  # a policy bug must not take /metrics (the router's view) down
            log.exception("policy %s cannot rank a probe job", sched.policy.name)
            return list(sched.waiting)
        return [job for prio, job_key, job in sched.waiting.keyed()
                if (prio, job_key) <= key or sched.waiting.deadline(job) <= now]
