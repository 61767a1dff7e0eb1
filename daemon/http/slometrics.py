"""Latency-objective metrics: per request class, requests that met, missed, were refused or
shed, the TTFT and TPOT slack of those served, and each executor's predicted TTFT for a new
request (what a router reads to pick the pod that meets a deadline)."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from daemon.core.job import Job, JobStatus, Refusal
from daemon.core.overload import LATE_HORIZON_S
from daemon.core.scheduler import Scheduler
from daemon.core.slo import attainment

log = logging.getLogger(__name__)

# Seconds of slack (objective minus actual): negative = missed by that much.
_SLACK_BUCKETS = (-10, -2.5, -1, -0.5, -0.25, -0.1, -0.05, -0.01, 0, 0.01, 0.05, 0.1, 0.25,
                  0.5, 1, 2.5, 10)
# A would-be refusal's prediction over its objective (Refusal.overshoot).
OVERSHOOT_BUCKETS = (1.1, 1.25, 1.5, 2.0, 3.0, 5.0)


class SloMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "lengthwise_slo_requests", "Requests with a latency objective by class "
            "(priority) and outcome: met, missed (served late, or failed), refused (429 at "
            "arrival: it could not meet its objective), shed (dropped while waiting)",
            ["priority", "outcome"], registry=registry)
        self.ttft_slack = Histogram(
            "lengthwise_slo_ttft_slack_seconds", "TTFT objective minus the actual TTFT of "
            "requests served (negative: missed)", ["priority"], buckets=_SLACK_BUCKETS,
            registry=registry)
        self.tpot_slack = Histogram(
            "lengthwise_slo_tpot_slack_seconds", "TPOT objective minus the actual mean time "
            "per output token (negative: missed)", ["priority"], buckets=_SLACK_BUCKETS,
            registry=registry)
        self.shadow = Counter(
            "lengthwise_slo_shadow_refusals", "Requests admission would have refused in "
            "shadow mode ([slo] enforce = false), served anyway, by class and outcome: met "
            "(the refusal would have been wrong) or missed; precision = missed / all; and "
            "by cause (as lengthwise_slo_refusals_total's)",
            ["priority", "outcome", "cause"], registry=registry)
        self.shadow_overshoot = Histogram(
            "lengthwise_slo_shadow_overshoot", "Shadow mode's would-be refusals by how far "
            "the prediction they were refused on was over the objective (predicted / "
            "objective) and outcome: above a bucket's bound, missed / all is the precision "
            "of refusing only predictions over it", ["outcome"], buckets=OVERSHOOT_BUCKETS,
            registry=registry)
        self.refusals = Counter(
            "lengthwise_slo_refusals", "Requests refused (429) as unable to meet their "
            "objective, by class and cause: ttft:queue (the forecast of the work ahead), "
            "ttft:memory (of its KV finding room), ttft:none (no wait: the time since "
            "arrival and the prefill), tpot (the decode step)", ["priority", "cause"],
            registry=registry)

    def refused(self, priority: int, refusal: Refusal) -> None:
        self.requests.labels(str(priority), "refused").inc()
        self.refusals.labels(str(priority), refusal.cause).inc()

    def observe(self, job: Job) -> None:
        """A job ended (once per job); a client that left early counts nowhere."""
        if job.slo is None or (job.status is JobStatus.ABORTED and job.finish_reason != "shed"):
            return
        priority = str(job.priority)
        if job.finish_reason == "shed":
            self.requests.labels(priority, "shed").inc()
            return
        result = attainment(job) if job.status is JobStatus.FINISHED else None
        if result is not None:
            if result.ttft_slack_s is not None:
                self.ttft_slack.labels(priority).observe(result.ttft_slack_s)
            if result.tpot_slack_s is not None:
                self.tpot_slack.labels(priority).observe(result.tpot_slack_s)
        met = result is not None and result.met
        self.requests.labels(priority, "met" if met else "missed").inc()
        refusal = job.would_refuse
        if refusal is not None:
            outcome = "met" if met else "missed"
            self.shadow.labels(priority, outcome, refusal.cause).inc()
            self.shadow_overshoot.labels(outcome).observe(refusal.overshoot(job.slo))
            first = ("no first token" if job.first_token_time is None else "first token after "
                     f"{(job.first_token_time - job.arrival_time) * 1000:.0f} ms")
            log.info("shadow mode: %s would have been refused (%s); %s, %s", job.job_id,
                     refusal.explain(), first, outcome)


class PredictedTtftCollector(Collector):
    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "lengthwise_predicted_ttft_seconds", "Predicted time to first token of a new "
            "best-effort request of class 0 on this executor, from the learned clock and "
            "the predicted work ahead (absent while its engine is down)", labels=["executor"])
        forecast = self._scheduler.forecast
        for lane in self._scheduler.lanes:
            ttft = forecast.ttft_s(lane)
            if math.isfinite(ttft):
                family.add_metric([lane.name], ttft)
        yield family
        margin = GaugeMetricFamily(
            "lengthwise_slo_admission_margin_ratio", "What admission multiplies a request's "
            "forecast wait by before it compares it with the TTFT objective, by what bounds "
            "the forecast (queue: the work ahead; memory: its KV fitting apart): the median "
            "([slo] refuse_quantile) of real / forecast wait of the requests it promised "
            "such a start in the last 30 s (1 until 8 of them started)", labels=["forecast"])
        for name, memory in (("queue", False), ("memory", True)):
            margin.add_metric([name], forecast.margin(memory))
        yield margin
        yield GaugeMetricFamily(
            "lengthwise_slo_overloaded", "1 while admission may refuse on a forecast of the "
            "queue: a waiting request turned late, or a request was refused on a forecast, "
            f"in the last {LATE_HORIZON_S:g} s ([slo] refuse_after_late), and with [slo] "
            "refuse_inflow set, requests came in at least that much faster than they ended; "
            "0: it refuses no request on its forecast wait",
            value=float(forecast.overload.refusing(forecast.now())))
