"""Prometheus metrics: live state read at scrape time (collectors), latencies observed as
jobs end (Metrics.observe_job, fed by the daemon's wiring from the core's ended-jobs queue)."""

from __future__ import annotations

import collections
import math
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from daemon.core.costmodel import TERMS
from daemon.core.job import Job, JobStatus
from daemon.core.lanes import Lane
from daemon.core.scheduler import Scheduler
from daemon.executors.base import Executor
from daemon.http.loopwatch import PROBE_S, LoopWatch
from daemon.http.slometrics import PredictedTtftCollector, SloMetrics
from daemon.prediction import Predictions

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_RATIO_BUCKETS = (-4, -3, -2, -1, -0.5, -0.25, 0, 0.25, 0.5, 1, 2, 3, 4)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1)
_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
_RECENT_JOBS = 256  # finished jobs whose sizes define "median size" and the decode rate


class RecentJobs:
    """Sizes and decode speed of recently finished jobs (router metrics' estimates)."""

    def __init__(self) -> None:
        self.prompt_tokens: collections.deque[int] = collections.deque(maxlen=_RECENT_JOBS)
        self.output_tokens: collections.deque[int] = collections.deque(maxlen=_RECENT_JOBS)
        self.tpot_s: collections.deque[float] = collections.deque(maxlen=_RECENT_JOBS)

    def observe(self, job: Job) -> None:
        if job.status != JobStatus.FINISHED or job.first_token_time is None:
            return
        self.prompt_tokens.append(job.num_prompt_tokens)
        self.output_tokens.append(job.num_generated_tokens)
        if job.num_generated_tokens > 1 and job.finish_time is not None:
            decode_s = job.finish_time - job.first_token_time
            self.tpot_s.append(decode_s / (job.num_generated_tokens - 1))


class _SchedulerCollector(Collector):
    def __init__(self, scheduler: Scheduler, predictions: Predictions,
                 executors: Sequence[Executor]) -> None:
        self._scheduler = scheduler
        self._predictions = predictions
        self._executors = executors

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        sched = self._scheduler
        yield GaugeMetricFamily("lengthwise_queue_depth", "Jobs waiting in lengthwise",
                                value=len(sched.waiting))
        yield GaugeMetricFamily("lengthwise_prediction_scale", "Learned actual / predicted "
                                "output length (geometric mean over jobs that stopped by "
                                "themselves; 1 until 20 were seen)",
                                value=sched.estimates.calibration.scale)
        running = GaugeMetricFamily("lengthwise_running_jobs", "Jobs admitted to an executor "
                                    "(up to lengthwise_max_running plus scheduler.engine_queue "
                                    "waiting in the engine's own queue)", labels=["executor"])
        limit = GaugeMetricFamily("lengthwise_max_running", "Admission cap by count per "
                                  "executor (scheduler.max_running, or under \"auto\" the "
                                  "engine's max_num_seqs)", labels=["executor"])
        kv_blocks = GaugeMetricFamily("lengthwise_kv_blocks", "KV blocks the executor's "
                                      "engine can give requests, as it reported",
                                      labels=["executor"])
        reserved = GaugeMetricFamily("lengthwise_kv_reserved_blocks", "KV blocks reserved "
                                     "by admitted jobs' predicted footprints (prompt + an "
                                     "upper quantile of the answer)", labels=["executor"])
        for lane in sched.lanes:
            running.add_metric([lane.name], len(lane.running))
            limit.add_metric([lane.name], lane.max_running)
            reserved.add_metric([lane.name], lane.kv.blocks)
            if lane.capacity is not None:
                kv_blocks.add_metric([lane.name], lane.capacity.kv_blocks)
        yield from (running, limit, kv_blocks, reserved)
        yield from _clock_families(sched.lanes)
        counters = {
            "jobs_started": "Dispatches to an executor, resumes included",
            "jobs_finished": "Jobs that ended normally", "jobs_aborted": "Jobs aborted",
            "jobs_failed": "Jobs that failed in the engine", "preemptions": "Preemptions",
            "budget_yields": "Dispatches that used up their token budget",
            "tokens_generated": "Output tokens generated",
        }
        for field, doc in counters.items():
            family = CounterMetricFamily(f"lengthwise_{field}", doc, labels=["executor"])
            for lane in sched.lanes:
                family.add_metric([lane.name], getattr(lane.stats, field))
            yield family
        held = CounterMetricFamily(
            "lengthwise_admission_held", "Decision rounds that left the next waiting job "
            "waiting while this executor had a free slot, by the rule that held it: "
            "cache-full (the KV held now, as lengthwise counts it, has no room for its "
            "context), wait-is-cheaper (room frees sooner than a preemption costs), peak "
            "(scheduler.admission = peak), policy (the policy's order or pacing)",
            labels=["executor", "reason"])
        for lane in sched.lanes:
            for reason, count in lane.held.items():
                held.add_metric([lane.name, reason], count)
        yield held
        yield from _kv_families(sched, self._executors)
        pstats = self._predictions.stats
        yield CounterMetricFamily("lengthwise_predictions", "Output-length predictions made",
                                  value=pstats.predictions)
        yield CounterMetricFamily("lengthwise_prediction_fallbacks", "Jobs that got the "
                                  "fallback estimate (predictor failed or was late)",
                                  value=pstats.fallbacks)
        yield CounterMetricFamily("lengthwise_predictor_reloads", "Predictors swapped for a "
                                  "changed model on SIGHUP", value=pstats.reloads)
        yield CounterMetricFamily("lengthwise_predictor_reload_failures", "Changed predictor "
                                  "models refused on SIGHUP (the running one was kept)",
                                  value=pstats.reload_failures)
        rep = sched.repredictor
        yield CounterMetricFamily("lengthwise_repredictions", "Remaining-length re-predictions "
                                  "applied to running jobs", value=rep.jobs)
        yield CounterMetricFamily("lengthwise_repredict_batches", "Re-prediction batches asked "
                                  "of the iterative predictor", value=rep.batches)
        yield CounterMetricFamily("lengthwise_repredict_failures", "Re-prediction batches that "
                                  "failed or timed out (old estimates kept)", value=rep.failures)


def _clock_families(lanes: Sequence[Lane]) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """Each executor's learned step times (daemon/core/clock.py)."""
    coefficient = GaugeMetricFamily(
        "lengthwise_step_coefficient_seconds", "Learned engine step cost: step = "
        "prefill_base_s [prefill] + prefill_per_token_s x prefilled + decode_base_s + "
        "decode_per_seq_s x batch + decode_per_context_token_s x context tokens",
        labels=["executor", "term"])
    step = GaugeMetricFamily("lengthwise_predicted_decode_step_seconds", "Predicted seconds "
                             "of the executor's next decode step: its running batch and "
                             "context (one sequence when idle) on the learned clock",
                             labels=["executor"])
    samples = CounterMetricFamily("lengthwise_step_samples", "Engine steps the clock "
                                  "learned from (idle gaps excluded)", labels=["executor"])
    error = GaugeMetricFamily("lengthwise_step_fit_error", "Median relative error of the "
                              "clock's last fit over its window of steps", labels=["executor"])
    for lane in lanes:
        clock = lane.clock
        for term, value in zip(TERMS, clock.cost.vector(), strict=True):
            coefficient.add_metric([lane.name, term], value)
        context = sum(job.num_context_tokens
                      for job in lane.running.values())
        step.add_metric([lane.name], clock.decode_step_s(max(len(lane.running), 1), context))
        samples.add_metric([lane.name], clock.samples)
        if clock.fits:
            error.add_metric([lane.name], clock.fit_error)
    yield from (coefficient, step, samples, error)


def _kv_families(sched: Scheduler, executors: Sequence[Executor]
                 ) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """Resumes and kvstore, per executor. Recomputed tokens count what a resumed job's
    engine prefilled again: its context minus the engine's cached tokens, plus kvstore
    loads that failed (vLLM counts those as cached although it computes them again).
    Resumes are split by `kv`: "offloaded" (the job's last preemption saved its KV to
    kvstore) or "not_offloaded" (kept in or dropped from the engine's prefix cache, a
    slice, an engine failure)."""
    labels = ["executor", "kv"]
    resumes = CounterMetricFamily("lengthwise_resume", "Resumed dispatches (after a "
                                  "preemption, a slice or an engine failure) that reached "
                                  "the engine", labels=labels)
    recomputed = CounterMetricFamily("lengthwise_resume_recomputed_tokens", "Prompt + "
                                     "generated tokens resumed jobs had to prefill again",
                                     labels=labels)
    context = CounterMetricFamily("lengthwise_resume_context_tokens", "Prompt + generated "
                                  "tokens of resumed dispatches (the recomputed tokens' "
                                  "denominator)", labels=labels)
    stored = GaugeMetricFamily("lengthwise_kvstore_bytes", "Bytes of KV blocks held in "
                               "the executor's kvstore", labels=["executor"])
    kv_counters = {
        "saved": CounterMetricFamily("lengthwise_kvstore_saved_tokens", "Tokens of KV saved "
                                     "to kvstore by preempted jobs", labels=["executor"]),
        "loaded": CounterMetricFamily("lengthwise_kvstore_loaded_tokens", "Tokens of KV "
                                      "loaded from kvstore instead of prefilled",
                                      labels=["executor"]),
        "evicted": CounterMetricFamily("lengthwise_kvstore_evicted_tokens", "Tokens of KV "
                                       "evicted from kvstore to stay within its budget",
                                       labels=["executor"]),
    }
    for lane, ex in zip(sched.lanes, executors, strict=True):
        totals = ex.kvstore_totals()
        failed = 0 if totals is None else totals.load_failed_tokens
        every, offloaded = lane.resumes, lane.offloaded_resumes
        # Only offloaded jobs' resumes load from kvstore, so its failed loads are theirs.
        for kv, count, tokens, again in (
                ("offloaded", offloaded.resumes, offloaded.context_tokens,
                 offloaded.recomputed_tokens + failed),
                ("not_offloaded", every.resumes - offloaded.resumes,
                 every.context_tokens - offloaded.context_tokens,
                 every.recomputed_tokens - offloaded.recomputed_tokens)):
            resumes.add_metric([ex.name, kv], count)
            context.add_metric([ex.name, kv], tokens)
            recomputed.add_metric([ex.name, kv], again)
        if totals is not None:
            stored.add_metric([ex.name], totals.stored_bytes)
            kv_counters["saved"].add_metric([ex.name], totals.saved_tokens)
            kv_counters["loaded"].add_metric([ex.name], totals.loaded_tokens)
            kv_counters["evicted"].add_metric([ex.name], totals.evicted_tokens)
    yield resumes
    yield context
    yield recomputed
    yield stored
    yield from kv_counters.values()


class _EngineCollector(Collector):
    def __init__(self, executors: Sequence[Executor]) -> None:
        self._executors = executors

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        up = GaugeMetricFamily("lengthwise_engine_up", "1 while the executor's engine serves, "
                               "0 while it is down or restarting", labels=["executor"])
        restarts = CounterMetricFamily("lengthwise_engine_restarts", "Engines replaced after "
                                       "they died or hung", labels=["executor"])
        preemptions = CounterMetricFamily("lengthwise_engine_preemptions", "Requests the "
                                          "engine preempted by itself (its KV cache ran out)",
                                          labels=["executor"])
        for ex in self._executors:
            up.add_metric([ex.name], float(ex.down_reason is None))
            restarts.add_metric([ex.name], ex.restarts)
            preemptions.add_metric([ex.name], ex.engine_preemptions)
        yield up
        yield restarts
        yield preemptions


class Metrics:
    """The registry, the histograms jobs and predictor calls are observed into, and the
    recent-jobs window. `watch` adds the collectors that read live state at scrape time."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.recent = RecentJobs()
        self.slo = SloMetrics(self.registry)
        self.ttft = Histogram("lengthwise_ttft_seconds", "Arrival to first token",
                              ["executor"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.tpot = Histogram("lengthwise_tpot_seconds", "Mean time per output token after the "
                              "first", ["executor"], buckets=_TPOT_BUCKETS, registry=self.registry)
        self.jct = Histogram("lengthwise_jct_seconds", "Arrival to last token", ["executor"],
                             buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.ttft_phase = Histogram(
            "lengthwise_ttft_phase_seconds", "Where the time to first token went: predict "
            "(arrival until it first waits in lengthwise's queue: its prediction, for policies "
            "that predict first), queue (waiting in lengthwise until first launched), engine "
            "(launch to first token: the command's trip, the engine's own queue, prefill)",
            ["phase"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.requests_open = Gauge("lengthwise_http_requests_open", "Connections with a "
                                   "request in flight, what server.max_connections caps "
                                   "(/health and /metrics not counted)", registry=self.registry)
        self.http_errors = Counter("lengthwise_http_errors", "Requests refused with an error",
                                   ["status", "type"], registry=self.registry)
        self.prediction_s = Histogram("lengthwise_prediction_batch_seconds", "Time of one "
                                      "predictor call (a micro-batch)", buckets=_TPOT_BUCKETS,
                                      registry=self.registry)
        # log2(first prediction / true length) for jobs whose true length is known (stopped
        # by themselves, or forced to max_tokens with ignore_eos): 0 is perfect, +1 means
        # predicted twice too long; jobs cut by max_tokens otherwise have no truth to compare.
        self.prediction_error = Histogram("lengthwise_prediction_log2_ratio",
                                          "log2(predicted / actual output tokens)",
                                          buckets=_RATIO_BUCKETS, registry=self.registry)
        self.loop_lag = Histogram("lengthwise_event_loop_lag_seconds", "How late a "
                                  f"{PROBE_S:g} s timer fires on the daemon's event loop: "
                                  "a blocked loop delays every stream", buckets=_LAG_BUCKETS,
                                  registry=self.registry)
        self.repredict_s = Histogram("lengthwise_repredict_batch_seconds", "Time of one "
                                     "re-prediction batch (detokenize + iterative model)",
                                     buckets=_TPOT_BUCKETS, registry=self.registry)
        self._config_info = Gauge("lengthwise_config_info", "The live configuration: its "
                                  "policy, and the sha256 of the whole tree as it runs "
                                  "(changes when a reload changes anything)",
                                  ["policy", "config_sha256"], registry=self.registry)

    def watch(self, scheduler: Scheduler, predictions: Predictions,
              executors: Sequence[Executor]) -> None:
        self.registry.register(_SchedulerCollector(scheduler, predictions, executors))
        self.registry.register(_EngineCollector(executors))
        self.registry.register(PredictedTtftCollector(scheduler))

    def config_live(self, policy: str, config_sha256: str) -> None:
        """The configuration now running (at start and after each reload)."""
        self._config_info.clear()
        self._config_info.labels(policy, config_sha256).set(1)

    def observe_prediction_batch(self, seconds: float) -> None:
        self.prediction_s.observe(seconds)

    def observe_repredict_batch(self, seconds: float) -> None:
        self.repredict_s.observe(seconds)

    def observe_job(self, job: Job) -> None:
        """A job ended (once per job)."""
        self.recent.observe(job)
        self.slo.observe(job)
        if job.status != JobStatus.FINISHED or job.first_token_time is None:
            return
        executor = job.executor_name or ""
        assert job.finish_time is not None
        self.ttft.labels(executor).observe(job.first_token_time - job.arrival_time)
        self.jct.labels(executor).observe(job.finish_time - job.arrival_time)
        self._observe_phases(job, job.first_token_time)
        # The first prediction: re-predictions and demotions revise it on the way.
        predicted = job.initial_prediction
        actual = job.observed_output_tokens
        if predicted is not None and actual is not None:
            ratio = predicted / max(actual, 1)
            self.prediction_error.observe(math.log2(max(ratio, 1e-6)))
        if job.num_generated_tokens > 1:
            decode_s = job.finish_time - job.first_token_time
            self.tpot.labels(executor).observe(decode_s / (job.num_generated_tokens - 1))

    def _observe_phases(self, job: Job, first_token: float) -> None:
        queued, launched = job.first_enqueue_time, job.first_launch_time
        if queued is None or launched is None:
            return
        for phase, seconds in (("predict", queued - job.arrival_time),
                               ("queue", launched - queued), ("engine", first_token - launched)):
            self.ttft_phase.labels(phase).observe(max(seconds, 0.0))

    async def watch_loop_lag(self) -> None:
        """The lag probe, and the log of where the loop is when it blocks (loopwatch)."""
        await LoopWatch(self.loop_lag.observe).run()

    def render(self) -> bytes:
        return generate_latest(self.registry)
