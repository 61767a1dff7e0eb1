"""The scheduler core's settings: `[scheduler]` and `[scheduler.aging]`.

The core reads only this struct (handed in by the daemon's wiring), so this module imports
nothing from daemon/: daemon.config collects it into the operator's tree, benchmarks build
it directly. Constraints are declared on the fields; the one check that spans rooms
(max_running <= engine.max_num_seqs) and the policy name (the registry's) are daemon.config's.

`BENCH_KNOB` marks a field that only benchmarks and tests set: its default is the
operator's, and an operator's file that names it is refused as unknown (docs/benchmarks.md,
"Benchmark knobs"). Every room marks its own that way.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

BENCH_KNOB = msgspec.Meta(extra={"bench_knob": True})

_NonNegative = msgspec.Meta(ge=0)
# Which jobs backfill may start past a head aging promoted (SchedulerConfig's key).
PastPromoted = Literal["any", "promoted", "none", "upper"]


class AgingConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """[scheduler.aging]: every wait is bounded on the workload's own time scale.

    With overtaking (the default) a job is promoted once slowdown x (the jobs running
    together) later arrivals started before it. Without, its bound is slowdown x the
    typical predicted service time (an EWMA over arriving jobs of the seconds each needs
    once it runs in a full batch, from the cost model), at least min_wait_s. Either way,
    at most promote_after_s. A job whose total wait (all its waits:
    first, and after each preemption or slice) reaches its bound is promoted ahead of every
    non-promoted job, earliest deadline first, and is no longer preempted.
    """

    # The tail knob: a job may be overtaken by this many batches of later arrivals (slowdown
    # x the jobs running together; without overtaking: it may wait this many typical
    # service times); 0 = only the absolute bound below. Lower: tail nearer FCFS's;
    # higher: mean nearer the policy's own.
    # 0.25: "never worse than vLLM" first. On the engine with 4 slots (3 repetitions, with
    # preempt off), 1.0x load: p99 TTFT 0.95x and p99 JCT 1.01x vLLM's server's against
    # 1.11x and 1.12x with 0.5 (docs/results/2026-11-27-aging-defaults-4-slots.md). In the
    # simulator's memory-bound regime at ~1.05x: p99 JCT 1.00x FCFS's (0.5: 1.02x, 1.0:
    # 1.05x, 2.0: 1.21x), mean 0.94x (0.5: 0.90x).
    slowdown: Annotated[float, _NonNegative] = 0.25
    # Absolute backstop (s): no job waits longer than this in total, whatever its size.
    promote_after_s: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    # Seconds every job may wait before its bound applies (a floor, <= promote_after_s).
    min_wait_s: Annotated[float, _NonNegative, BENCH_KNOB] = 0.0
    # On: a promoted job that finds no room (no free slot; under memory admission, no room
    # for its KV) preempts the running job with the most predicted work left (if that is
    # more than its own) among those whose leaving lets it start, for every policy. Off (the
    # default): it takes the next room that frees, ahead of every other job. On the engine
    # with 4 slots at 0.8x load, on paused a stopped job's stream 3-8 s (it waits again in
    # the policy's order) and cost 1.04x vLLM's mean TPOT; off: 1.00x, no pause over 0.5 s
    # (docs/results/2026-11-27-aging-defaults-4-slots.md); in the memory-bound simulator it
    # acted 0-1 times in 300 requests.
    preempt: Annotated[bool, BENCH_KNOB] = False
    # Before launching the policy's pick, check that no waiting job would then miss its
    # bound that it meets if jobs start in deadline order (the first 64 deadlines); if one
    # would, the earliest deadline goes first. Acts before a bound is missed, not after.
    lookahead: Annotated[bool, BENCH_KNOB] = True
    # Bound places, not seconds: a job is promoted once slowdown x (the jobs running
    # together) later arrivals have started before it, so it starts at most that many
    # places (and one decision round's launches) after FCFS would have started it,
    # whatever the clock's error; only the absolute backstop (promote_after_s) is in
    # seconds. False: the bound is slowdown x the typical service, which any overload
    # passes for every job (docs/policies.md).
    overtaking: Annotated[bool, BENCH_KNOB] = True
    # What slowdown multiplies into an arriving job's overtake budget: "together" (the jobs
    # running together), or "place" (those plus the jobs already waiting when it arrived:
    # its place in FCFS's line, so that it starts at most ~slowdown x its FCFS wait later,
    # and a long queue in overload leaves the policy room to reorder it).
    overtake_base: Annotated[Literal["together", "place"], BENCH_KNOB] = "together"
    # False: no bound at all (comparisons with a policy's own starvation behaviour).
    enabled: Annotated[bool, BENCH_KNOB] = True


class SchedulerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    # Policy name from the registry in policies/: blend, fcfs, ssjf, hrrn, isrtf, alise,
    # scls; oracle-sjf, oracle-srpt and oracle-blend need true lengths (benchmarks only).
    policy: str = "ssjf"
    # Jobs admitted to one executor at once; the rest wait in lengthwise, where the policy
    # orders them. "auto": as many as the engine's KV cache holds at their predicted
    # footprint (prompt + an upper quantile of the answer: core/admission.py), at most
    # engine.max_num_seqs. A number: that many (<= engine.max_num_seqs), whatever memory.
    max_running: Annotated[int, msgspec.Meta(ge=1)] | Literal["auto"] = "auto"
    # Waiting jobs beyond this are refused with 429.
    max_waiting: Annotated[int, _NonNegative] = 1024
    # Learn the factor between predicted and actual lengths from jobs that stopped by
    # themselves, and scale predictions by it (core/calibration.py); off only to measure
    # what it buys.
    calibrate_lengths: Annotated[bool, BENCH_KNOB] = True
    # A request's max_tokens caps its predicted length. Benchmarks that force every output
    # length through max_tokens turn it off: there the cap hands policies the truth.
    trust_budget: Annotated[bool, BENCH_KNOB] = True
    # Executor for a job: by predicted outstanding work (the policy's own), or as routers
    # do (least_queue, round_robin: the fleet benchmark's comparisons).
    placement: Annotated[Literal["predicted", "least_queue", "round_robin"],
                         BENCH_KNOB] = "predicted"
    # Memory admission's upper estimate of an answer: this quantile of its predicted length
    # (where the predictor has a quantile head covering it; the shipped one has 0.1-0.9) ...
    admission_quantile: Annotated[float, msgspec.Meta(gt=0, lt=1), BENCH_KNOB] = 0.5
    # ... else the point prediction times this.
    upper_factor: Annotated[float, msgspec.Meta(ge=1), BENCH_KNOB] = 2.0
    # Learn each engine's step times from the steps it serves (core/clock.py); off: every
    # estimate stays on the configured cost model (to measure what learning buys).
    learn_clock: Annotated[bool, BENCH_KNOB] = True
    # Jobs per engine handed to it beyond max_running: they wait in the engine's own
    # priority queue, in the policy's order (its engine priority), so a slot that frees
    # refills at the engine's next step instead of after a round trip through the core
    # (worth 6-13 % of TTFT at 0.8-1.0x load with 4 slots: docs/results/
    # 2026-11-27-sweep-4-slots.md). Only under max_running = "auto", whose count cap is
    # the engine's max_num_seqs (a number is the operator's cap on admitted jobs); it adds
    # to the count only: a full KV ledger admits nothing past it. One that has not started
    # yields to a more urgent class or objective (core/decisions.py, displaced). 0: every
    # job waits in lengthwise's queue.
    engine_queue: Annotated[int, _NonNegative, BENCH_KNOB] = 1
    # Memory admission: when the next job's KV fits nowhere yet, jobs behind it start where
    # they fit if they are predicted to end before it could start (core/decisions.py,
    # backfill); off: every job behind it waits, as in vLLM's own scheduler.
    backfill: Annotated[bool, BENCH_KNOB] = True
    # Which jobs backfill may start past a head that aging promoted: "any" (as past any
    # head), "promoted" (only jobs promoted too: a young job does not pass an aged one),
    # "upper" (only jobs that end before it even at their upper length estimate) or
    # "none" on the lane where it would start first (there it waits for room, as every
    # head does in vLLM's own scheduler; other lanes backfill as before). "none" against
    # "any", best effort: at 0.8-1.0x p99 TTFT 0.92x against 0.99x vLLM's server's at
    # equal engine speed (13 pairs), p99 JCT 0.95x against 0.99x; at 1.5x mean JCT 0.88x
    # against 0.85x; at 0.6x p99 TTFT worse (in one draw at equal engine speed 1.96 s
    # against 0.54 s): a lane held behind a big promoted head in a light-load burst
    # (docs/results/2026-11-29-backfill-past-promoted.md). "upper" (conservative
    # backfilling): at 1.5x mean JCT 0.89x vLLM's against 0.68x, worse at 0.8x too
    # (docs/results/2026-11-29-upper-backfill-and-4-slots.md). Off.
    backfill_past_promoted: Annotated[PastPromoted, BENCH_KNOB] = "any"
    # Backfill's estimate of when the blocked head starts: when its projected peak fits.
    # True, under admission "now": when its context finds room in the KV held now
    # (admission.seconds_until_room), which is when that admission starts it, sooner, so
    # fewer jobs pass it. Tried 2026-11-29: at 1.0x better in 3 of 3 draws (mean JCT 0.72x
    # vLLM's server's against 0.98x), at 0.8x worse with more engine preemptions (docs/
    # results/2026-11-29-engine-queue-past-full-kv.md): off until measured further.
    backfill_room: Annotated[bool, BENCH_KNOB] = False
    # Memory admission: "now" starts a job whenever its context fits in the KV held now,
    # as vLLM's own scheduler does (the engine preempts if the cache runs out later);
    # "work-conserving" holds it where waiting for the projected peak to fit looks cheaper
    # than the preemption the overflow would cost (core/admission.py; the default until
    # 2026-11-28: against "now", at equal engine speed over 7 pairs at 0.8-1.5x, p99 JCT
    # 1.07x, p99 TTFT 1.14x: docs/results/2026-11-28-cold-forecasts.md); "peak" holds it
    # until the projected peak fits (the rule before 2026-11-26).
    admission: Annotated[Literal["now", "work-conserving", "peak"], BENCH_KNOB] = "now"
    # Work-conserving admission: count the KV held now from the engine's own report (the
    # blocks in use as of its last step, plus the jobs handed to it since) where that is
    # lower than lengthwise's ledger and no job the engine preempted waits in its queue;
    # off: the ledger only (each running job's context as lengthwise last saw it). At 1.0x
    # memory-bound the ledger said full while the engine had 6-15 of 63 blocks free; on:
    # TTFT 1.24x vLLM's server's against 1.66x, p99 JCT 1.25x against 1.49x (2 repetitions,
    # docs/results/2026-11-27-memory-bound-engine-report.md).
    engine_kv: Annotated[bool, BENCH_KNOB] = True
    # The priority vLLM gets with each job, which picks its victim when its KV runs out
    # (the job it ranks last) and orders its own queue. "launch" (the default): the class
    # only, so vLLM breaks the tie by its own request's arrival, the launch: its own FCFS
    # victim, the job started last (mostly the cheapest recompute). "policy": the policy's
    # (Policy.engine_priority: for ssjf, most predicted tokens left last, which preempted
    # the same long jobs again and again: p99 JCT ~1.3x vLLM's server's at 0.8-1.0x
    # memory-bound); "arrival": the class, then arrival order (the latest arrival).
    engine_order: Annotated[Literal["launch", "policy", "arrival"], BENCH_KNOB] = "launch"
    # A JSON line per admission forecast, launch and stop to this file (core/trace.py), for
    # `python -m bench.forecasterrors`; "" = none. `lengthwise bench sweep --trace` sets it.
    trace: Annotated[str, BENCH_KNOB] = ""
    aging: AgingConfig = msgspec.field(default_factory=AgingConfig)

    @property
    def fixed_running(self) -> int | None:
        """max_running when it is a number; None for "auto"."""
        return None if self.max_running == "auto" else int(self.max_running)
