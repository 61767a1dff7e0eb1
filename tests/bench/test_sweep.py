"""`bench sweep`: engine speed compared at matched batch sizes, SLO capacity, the figures
over repetitions, the tables and the plots (on synthetic runs), and one tiny sweep end to
end on the simulated engine. (How a run's step times are read: test_enginespeed.py.)"""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
import pytest

from bench.enginespeed import Bin, DecodeSpeed, flagged, speed_ratio
from bench.metrics import RequestResult, summarize
from bench.sweep import SweepResults, load_results, summary_text
from bench.sweep_plots import plot_sweep
from bench.sweepstats import (
    SweepRun,
    at_equal_speed,
    attainment,
    capacities,
    paired_loads,
    pairs,
    points,
    slo_capacity,
)
from bench.workload import WorkloadSpec


def _speed(steps: dict[int, tuple[float, int]]) -> DecodeSpeed:
    bins = [Bin(batch=b, step_s=s, gaps=n) for b, (s, n) in steps.items()]
    total = sum(n for _, n in steps.values())
    return DecodeSpeed(step_s=sum(s * n for s, n in steps.values()) / total, batch=1.0,
                       gaps=total, bins=bins)


def test_engine_speed_is_compared_at_matched_batch_sizes() -> None:
    vllm = _speed({1: (0.010, 500), 16: (0.030, 500)})
    # lengthwise ran small batches mostly: its overall step is far faster, the engine not.
    lw = _speed({1: (0.0105, 900), 16: (0.0315, 100), 32: (0.05, 100)})
    ratio, matched = speed_ratio(vllm, lw)
    assert matched and ratio == pytest.approx(1.05)
    assert lw.step_s / vllm.step_s == pytest.approx(0.8) and not flagged(ratio)
    slow = _speed({1: (0.0115, 900), 16: (0.0345, 100)})
    ratio, _ = speed_ratio(vllm, slow)
    assert ratio == pytest.approx(1.15) and flagged(ratio) and flagged(1 / ratio)
    # no bin shared with enough gaps: the overall step times, marked unmatched
    ratio, matched = speed_ratio(vllm, _speed({64: (0.06, 1000)}))
    assert not matched and ratio == pytest.approx(0.06 / 0.02)


def test_pairs_compare_the_engines_own_steps_where_both_logged_them() -> None:
    """The client saw both engines at one speed, their own lines say 1.3x: the pair is
    flagged by the lines; where one run has none, the client's view stands."""
    vllm, lw = _run("vllm", 1.0, 0, 2.0, 1.0, 0.01), _run("lw", 1.0, 0, 2.0, 1.0, 0.01)
    own = {4: (0.003, 900)}
    logged = [msgspec.structs.replace(vllm, engine_speed=_speed(own)),
              msgspec.structs.replace(lw, engine_speed=_speed({4: (0.0039, 900)}))]
    [pair] = pairs(logged, "vllm")
    assert pair.step_ratio == pytest.approx(1.3) and pair.flagged
    assert points(logged)[1].figures["engine_step_s"].median == pytest.approx(0.0039)
    [pair] = pairs([logged[0], lw], "vllm")
    assert pair.step_ratio == pytest.approx(1.0) and not pair.flagged
    assert "engine_step_s" not in points([vllm, lw])[0].figures


def test_slo_capacity_is_the_last_crossing_interpolated() -> None:
    crossing = slo_capacity([(0.2, 1.0), (0.4, 1.0), (0.6, 0.95), (0.8, 0.85), (1.0, 0.5)])
    assert crossing.bound == "" and crossing.load == pytest.approx(0.7)
    dip = slo_capacity([(0.6, 0.5), (0.2, 0.8), (0.4, 0.95)])  # unsorted, not monotone
    assert dip.load == pytest.approx(0.4 + 0.05 / 0.45 * 0.2)
    always = slo_capacity([(0.2, 1.0), (2.0, 0.92)])
    assert (always.load, always.bound, always.describe()) == (2.0, ">=", ">=2.00x")
    never = slo_capacity([(0.4, 0.5), (0.2, 0.89)])
    assert (never.load, never.bound) == (0.2, "<")


def test_attainment_counts_refusals_and_failures_as_misses() -> None:
    ok = [RequestResult(index=i, arrival_s=0.0, prompt_tokens=5, output_tokens=11, ok=True,
                        ttft_s=0.1 * i, jct_s=0.1 * i + 0.5) for i in range(1, 9)]
    refused = [RequestResult(index=9, arrival_s=0.0, prompt_tokens=5, output_tokens=0,
                             ok=False, error="Too Many Requests")]
    # TTFT <= 0.5 s: 5 of 8 served; TPOT 50 ms each: all within 0.05
    assert attainment(ok + refused, 0.5, 0.05) == pytest.approx(5 / 9)
    assert attainment(ok, None, 0.049) == 0.0
    assert attainment(ok, None, None) is None


def _run(system: str, load: float, repeat: int, jct: float, att: float,
         step: float) -> SweepRun:
    reqs = [RequestResult(index=i, arrival_s=float(i), prompt_tokens=5, output_tokens=10,
                          ok=True, ttft_s=jct / 4, jct_s=jct) for i in range(4)]
    speed = DecodeSpeed(step_s=step, batch=4.0, gaps=400, bins=[Bin(4, step, 400)])
    return SweepRun(system=system, load=load, rate=load * 2.0, repeat=repeat, position=0,
                    summary=summarize(reqs), p99_tpot=jct / 40, attainment=att,
                    refused=10 * (1 - att), engine_preemptions=7.0 if system == "vllm" else 1,
                    policy_preemptions=0.0 if system == "vllm" else 2, speed=speed,
                    wall_s=1.0)


def _sweep() -> list[SweepRun]:
    """vllm and lengthwise at 0.5x, 1x and 2x, 3 repetitions; lengthwise's engine ran 20 %
    slow in repetition 2 at 1x."""
    att = {("vllm", 0.5): 1.0, ("vllm", 1.0): 0.92, ("vllm", 2.0): 0.4,
           ("lw", 0.5): 1.0, ("lw", 1.0): 0.98, ("lw", 2.0): 0.7}
    runs = []
    for repeat in range(3):
        for load in (0.5, 1.0, 2.0):
            for system in ("vllm", "lw"):
                slow = 1.2 if (system, load, repeat) == ("lw", 1.0, 2) else 1.0
                runs.append(_run(system, load, repeat, jct=load + repeat * 0.1,
                                 att=att[system, load] - 0.01 * repeat, step=0.01 * slow))
    return runs


def test_points_capacities_and_pairs_of_a_sweep() -> None:
    runs = _sweep()
    pts = {(p.system, p.load): p for p in points(runs)}
    lw = pts["lw", 1.0]
    assert lw.repeats == 3 and lw.rate == 2.0
    jct = lw.figures["mean_jct"]
    assert (jct.median, jct.min, jct.max) == pytest.approx((1.1, 1.0, 1.2))
    assert lw.figures["attainment"].median == pytest.approx(0.97)
    assert lw.figures["step_s"].max == pytest.approx(0.012)
    caps = {c.system: c for c in capacities(runs)}
    # vllm repetition 0: 0.92 at 1x, 0.4 at 2x: 1 + 0.02 / 0.52
    assert caps["vllm"].per_repeat[0].load == pytest.approx(1 + 0.02 / 0.52)
    assert caps["vllm"].spread.min == caps["vllm"].per_repeat[2].load  # falls with repeat
    assert caps["lw"].spread.median == pytest.approx(1 + 0.07 / 0.28)
    found = pairs(runs, "vllm")
    assert len(found) == 9 and all(p.matched and p.system == "lw" for p in found)
    assert [(p.load, p.repeat) for p in found if p.flagged] == [(1.0, 2)]
    assert capacities([msgspec.structs.replace(r, attainment=None) for r in runs]) == []


def test_ratios_at_equal_engine_speed_take_the_machine_out() -> None:
    """lengthwise 0.9x vLLM's JCT at equal speed, and its JCT grows as its engine's step
    time squared: in pairs where its engine ran 0.9-1.3x slow the plain ratios average
    above 1, the fit reads 0.9x back; a band with fewer than 4 pairs is left out."""
    runs = []
    for k, (load, step) in enumerate([(0.2, 0.9), (0.4, 1.1), (0.6, 1.3), (0.6, 1.0),
                                      (1.0, 1.0), (1.0, 1.2)]):
        runs.append(_run("vllm", load, k, jct=2.0, att=1.0, step=0.01))
        runs.append(_run("lw", load, k, jct=2.0 * 0.9 * step ** 2, att=1.0, step=0.01 * step))
    found = {(a.band, a.figure): a for a in at_equal_speed(runs, "vllm")}
    light = found["below 0.8x", "mean_jct"]
    assert light.n == 4 and light.system == "lw"
    assert light.ratio == pytest.approx(0.9 * (0.9 * 1.1 * 1.3 * 1.0) ** 0.5, rel=1e-6)
    assert light.at_equal_speed == pytest.approx(0.9, rel=1e-6)
    assert light.low == pytest.approx(0.9, rel=1e-6) == light.high  # an exact fit
    assert not any(band == "0.8-1.2x" for band, _ in found)  # 2 pairs only


def test_paired_ratios_per_load_and_without_the_flagged_pairs() -> None:
    """Each pair shares its draw: its ratio, then their geometric mean (min-max) per load,
    and the mean over the pairs whose engines ran at the same speed."""
    runs = []
    for repeat, (factor, step) in enumerate([(0.8, 1.0), (1.0, 1.05), (1.25, 1.2)]):
        runs.append(_run("vllm", 1.0, repeat, jct=2.0 + repeat, att=0.5, step=0.01))
        runs.append(_run("lw", 1.0, repeat, jct=(2.0 + repeat) * factor, att=0.5 * factor,
                         step=0.01 * step))
    [row] = paired_loads(runs, "vllm")
    assert (row.system, row.load, row.n, row.flagged) == ("lw", 1.0, 3, 1)
    jct = row.ratios["mean_jct"]
    assert (jct.median, jct.min, jct.max) == pytest.approx((1.0, 0.8, 1.25))
    assert row.unflagged["p99_jct"] == pytest.approx(0.8 ** 0.5)  # the 1.2x pair left out
    assert row.ratios["attainment"].median == pytest.approx(1.0)
    text = summary_text(SweepResults(
        model="tiny", systems=["vllm", "lw"], loads=[1.0], repeats=3, capacity_rps=2.0,
        capacity_how="given", workload=WorkloadSpec(num=4), sample="held-out",
        slo_ttft=1.0, slo_tpot=None, slo=None, max_num_seqs=4, kv_blocks=0,
        max_running="auto", runs=runs, paired=[row]))
    assert "| 1x | lw | 3 (1) | " in text
    assert "| 1.00x (0.80–1.25); unflagged 0.89x |" in text


def test_summary_tables_and_plots(tmp_path: Path) -> None:
    runs = _sweep()
    results = SweepResults(
        model="tiny", systems=["vllm", "lw"], loads=[0.5, 1.0, 2.0], repeats=3,
        capacity_rps=2.0, capacity_how="given (--capacity)", workload=WorkloadSpec(num=4),
        sample="held-out", slo_ttft=1.0, slo_tpot=0.05, slo=None, max_num_seqs=4,
        kv_blocks=0, max_running="auto", runs=runs, points=points(runs),
        capacities=capacities(runs), pairs=pairs(runs, "vllm"))
    text = summary_text(results)
    assert "Load 1.0 = 2 req/s (given (--capacity))" in text
    assert "(judged only)" in text
    # mean JCT 1.10 (1.00-1.20) s, attainment 97.0 % (96-98), step 10 ms (10-12)
    assert "| 1x | lw | 2 |" in text and "| 1.10 (1.00–1.20) |" in text
    assert "| 97.0 (96.0–98.0) |" in text and "| 10.00 (10.00–12.00) |" in text
    assert "| 2x | lw | 1.00x | 1.00x | 1.00x | 1.00x | 1.00x | 1.77x |" in text  # 69 / 39 %
    assert "| lw | 1.25 (1.21–1.29) | 2.5 | 1.23x |" in text  # median (min–max), req/s
    assert "| 1x | lw | 1.00x, 1.00x, 1.20x! | 1 |" in text
    paths = plot_sweep(results.points, results.capacities, tmp_path, 2.0)
    assert {p.name for p in paths} == {"latency_vs_load.png", "engine_vs_load.png",
                                       "attainment_vs_load.png"}
    assert all(p.stat().st_size > 10_000 for p in paths)
    ratios = plot_sweep(results.points, results.capacities, tmp_path, 2.0, runs, "vllm")[-1]
    assert ratios.name == "ratios_vs_load.png" and ratios.stat().st_size > 10_000
    best_effort = [msgspec.structs.replace(r, attainment=None) for r in runs]
    assert len(plot_sweep(points(best_effort), [], tmp_path, 2.0)) == 2
    assert "attainment" not in points(best_effort)[0].figures


def test_refusals_and_shadow_precision_are_summed_per_load() -> None:
    """Enforcing runs show their 429s; shadow runs what they would have refused and how
    those requests did (missed: refusing them was right); vLLM's server has neither."""
    from bench.sweep_report import refusals_table

    runs = [_run("vllm", 0.5, r, jct=1.0, att=1.0, step=0.01) for r in range(2)]
    runs += [msgspec.structs.replace(_run("lw", 0.5, r, jct=1.0, att=1.0, step=0.01),
                                     refused=3.0 + r, waits={
                                         "held:policy": 1.0, "refused_by:ttft:queue": 1.0,
                                         "refused_by:ttft:memory": 2.0 + r})
             for r in range(2)]
    # each shadow run: its one met predicted under 1.25x the objective, of its missed one
    # under and the rest over (the daemon's histogram buckets are cumulative)
    runs += [msgspec.structs.replace(_run("lw+shadow", 0.5, r, jct=1.0, att=1.0, step=0.01),
                                     refused=0.0, waits={
                                         "shadow:met": 1.0, "shadow:missed": 2.0 + r,
                                         "shadow_by:ttft:memory/met": 1.0,
                                         "shadow_by:ttft:memory/missed": 1.0,
                                         "shadow_by:ttft:queue/missed": 1.0 + r,
                                         "overshoot:met/1.25": 1.0, "overshoot:met/+Inf": 1.0,
                                         "overshoot:missed/1.25": 1.0,
                                         "overshoot:missed/+Inf": 2.0 + r})
             for r in range(2)]
    table = refusals_table(runs)
    assert "| 0.5x | lw | 2 | 7 | 0 | 0 | 0 | – | – | ttft:memory 5, ttft:queue 2 |" in table
    assert ("| 0.5x | lw+shadow | 2 | 0 | 7 | 2 | 5 | 71 % | 100 % (3) | ttft:memory 4 (2 met), "
            "ttft:queue 3 (0 met) |") in table
    assert "vllm" not in table
    quiet = [msgspec.structs.replace(r, refused=0.0, waits={}) for r in runs]
    assert refusals_table(quiet) == ""


def test_a_tiny_sweep_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two lengthwise systems on the simulated engine (vLLM's server needs the real one,
    vLLM's client ~19 s of CPU a run: our client here), 2 loads x 1 repetition: each
    system started once and kept up, the order turning at the next load, every file."""
    from bench.cli import main
    from tests.support import TINY

    records = tmp_path / "records.jsonl"
    records.write_text("\n".join(f'{{"prompt": "tell me about item {i}", "output_tokens": '
                                 f'{8 + 3 * i}}}' for i in range(6)))
    out = tmp_path / "sweep"
    code = main(["sweep", "--engine-kind", "sim", "--client", "ours", "--model", str(TINY),
                 "--systems", "lengthwise:fcfs,lengthwise:oracle-sjf", "--capacity", "20",
                 "--loads", "1,0.5", "--repeats", "1", "--num", "6", "--lengths",
                 f"records:{records}", "--slo-ttft", "5", "--trace", "--out", str(out)])
    assert code == 0
    results = load_results(out / "sweep.json")
    assert [(r.load, r.system, r.position) for r in results.runs] == [
        (0.5, "lengthwise:fcfs", 0), (0.5, "lengthwise:oracle-sjf", 1),
        (1.0, "lengthwise:oracle-sjf", 0), (1.0, "lengthwise:fcfs", 1)]
    assert [r.rate for r in results.runs] == [10.0, 10.0, 20.0, 20.0]
    assert all(len(starts) == 1 for starts in results.startup_s.values())
    assert {p.name for p in out.glob("*.log")} == {"lengthwise-fcfs.log",
                                                   "lengthwise-oracle-sjf.log"}
    # --trace: each daemon's core wrote a launch and then a stop per request (6 x 2 loads
    # and the warm-up's; no objectives were sent, so no admission forecasts)
    for name in ("lengthwise-fcfs", "lengthwise-oracle-sjf"):
        lines = (out / f"{name}.trace.jsonl").read_text().splitlines()
        trace = [(r["ev"], r["id"]) for r in map(msgspec.json.decode, lines)]
        stopped = [job for ev, job in trace if ev == "stop"]
        assert len(stopped) >= 12 and all(
            ("launch", job) in trace[:trace.index(("stop", job))] for job in stopped)
    for run in results.runs:
        assert run.summary.n_completed == 6 and run.attainment == 1.0
        # the daemon's account of where each request's first token waited, over this run
        assert all(run.waits[f"ttft_n:{phase}"] == 6 for phase in ("predict", "queue", "engine"))
        assert run.speed is None  # our client: no token times
        saved = (out / "runs" / f"{run.system.replace(':', '-')}-x{run.load:g}-0.json")
        assert len(msgspec.json.decode(saved.read_bytes())["requests"]) == 6
    assert [(p.system, p.load, p.repeats) for p in results.points] == [
        ("lengthwise:fcfs", 0.5, 1), ("lengthwise:oracle-sjf", 0.5, 1),
        ("lengthwise:fcfs", 1.0, 1), ("lengthwise:oracle-sjf", 1.0, 1)]
    printed = capsys.readouterr().out
    assert printed.count("to first token: predict") == 4  # each run's line says it
    summary = (out / "summary.md").read_text()
    # both met the objective at every load: lower bounds, no ratio between them
    assert "| lengthwise:oracle-sjf | >=1.00 | >=20 | – | >=1.00x |" in summary
    assert summary in printed
    assert {p.name for p in out.glob("*.png")} == {"latency_vs_load.png",
                                                   "engine_vs_load.png",
                                                   "attainment_vs_load.png",
                                                   "ratios_vs_load.png"}
    # --report redraws it from OUT/sweep.json, running nothing
    assert main(["sweep", "--report", "--out", str(out)]) == 0
    assert summary in capsys.readouterr().out


def test_a_run_where_nothing_completed_is_summarized_and_read_back(tmp_path: Path) -> None:
    """Every request refused: no latency figure (–, not nan), attainment 0, and sweep.json
    (nan written as null) reads back, a pair-by-pair row whose pairs were all flagged
    included; a capacity below the lowest load is a bound."""
    refused = [RequestResult(index=i, arrival_s=float(i), prompt_tokens=5, output_tokens=0,
                             ok=False, error="Too Many Requests") for i in range(4)]
    runs = [_run("vllm", 0.5, 0, 1.0, 0.95, 0.01), _run("vllm", 1.0, 0, 1.0, 0.5, 0.01)]
    for load in (0.5, 1.0):
        runs.append(SweepRun(system="lw", load=load, rate=load * 2, repeat=0, position=1,
                             summary=summarize(refused), p99_tpot=None,
                             attainment=attainment(refused, 1.0, None), refused=4,
                             engine_preemptions=0, policy_preemptions=0, speed=None,
                             wall_s=1.0))
    results = SweepResults(
        model="tiny", systems=["vllm", "lw"], loads=[0.5, 1.0], repeats=1, capacity_rps=2.0,
        capacity_how="given", workload=WorkloadSpec(num=4), sample="held-out", slo_ttft=1.0,
        slo_tpot=None, slo=None, max_num_seqs=4, kv_blocks=0, max_running="auto", runs=runs,
        points=points(runs), capacities=capacities(runs), pairs=pairs(runs, "vllm"),
        paired=paired_loads(runs, "vllm"))
    flagged = [_run("vllm", 2.0, 0, 1.0, 0.5, 0.01), _run("lw", 2.0, 0, 1.0, 0.5, 0.02)]
    [all_flagged] = paired_loads(flagged, "vllm")
    assert all_flagged.flagged == 1 and math.isnan(all_flagged.unflagged["mean_jct"])
    results.paired.append(all_flagged)
    (tmp_path / "sweep.json").write_bytes(msgspec.json.encode(results))
    back = load_results(tmp_path / "sweep.json")
    assert math.isnan(back.runs[2].summary.mean_jct) and back.runs[2].attainment == 0.0
    assert math.isnan(back.paired[-1].unflagged["mean_jct"])
    text = summary_text(back)
    assert "| 0.5x | lw | 1 | – | – | – | – | – | – | 0.0 | 4 | 0 | 0 | – |" in text
    assert "| 0.5x | lw | – | – | – | – | – | 0.00x |" in text
    # vllm 0.95 at 0.5x, 0.5 at 1x: 0.5 + 0.05 / 0.45 x 0.5; lw below its lowest load
    assert "| vllm | 0.56 | 1.11 | 1.00x | 0.56x |" in text
    assert "| lw | <0.50 | <1 | <0.90x | <0.50x |" in text
    assert "| 0.5x | lw | – | 0 |" in text  # no step time: no pair to judge


def test_the_waits_a_server_counts_are_read_per_label_and_differenced() -> None:
    from bench.servers import Counters, _waits, describe_waits

    def scrape(held: float, queue_s: float, n: float, lag: tuple[int, int, int, int, int]
               ) -> Counters:
        text = "\n".join([
            '# TYPE lengthwise_admission_held_total counter',
            f'lengthwise_admission_held_total{{executor="e0",reason="policy"}} {held}',
            f'lengthwise_admission_held_total{{executor="e1",reason="policy"}} {held}',
            'lengthwise_admission_held_total{executor="e0",reason="wait-is-cheaper"} 3.0',
            f'lengthwise_ttft_phase_seconds_sum{{phase="queue"}} {queue_s}',
            f'lengthwise_ttft_phase_seconds_count{{phase="queue"}} {n}',
            f'lengthwise_ttft_phase_seconds_bucket{{le="1.0",phase="queue"}} {n}',
            'lengthwise_slo_shadow_refusals_total{outcome="missed",priority="0"} 2.0',
            *(f'lengthwise_event_loop_lag_seconds_bucket{{le="{le}"}} {count}'
              for le, count in zip(("0.025", "0.05", "0.1", "1.0", "+Inf"), lag, strict=True))])
        return Counters(0.0, 0.0, 0.0, _waits(text))

    run = (scrape(10, 4.5, 7, (990, 997, 998, 999, 1000))
           - scrape(4, 0.5, 2, (95, 99, 100, 100, 100)))
    assert run.waits == {"held:policy": 12.0, "held:wait-is-cheaper": 0.0,
                         "ttft_s:queue": 4.0, "ttft_n:queue": 5.0, "shadow:missed": 0.0,
                         "lag:0.025": 895.0, "lag:0.05": 898.0, "lag:0.1": 898.0,
                         "lag:1.0": 899.0, "lag:+Inf": 900.0}
    assert describe_waits(run.waits) == (
        "; held: policy 12; to first token: queue 800 ms mean; event loop late > 25 ms 5, "
        "> 50 ms 2, > 100 ms 2, > 1000 ms 1 of 900 probes")
    assert describe_waits({}) == ""


def test_send_slo_except_leaves_one_system_without_headers(tmp_path: Path) -> None:
    """One system with and one without its requests' objectives on the same draws: the
    headers go to every system but those named; a name not among --systems is refused."""
    import argparse

    from bench import client
    from bench.cli import main

    args = argparse.Namespace(send_slo=True, slo_ttft=1.0, slo_tpot=0.05,
                              send_slo_except="lengthwise:ssjf+slo.enforce=true")
    assert client.slo_headers(args, "lengthwise:ssjf") == {"x-llm-d-slo-ttft-ms": "1000",
                                                           "x-llm-d-slo-tpot-ms": "50"}
    assert client.slo_headers(args, "lengthwise:ssjf+slo.enforce=true") == {}
    # what each system's client is given in a measured run
    from bench.compare import run_options
    from bench.servers import parse_system

    args.natural, args.max_model_len = False, 2048
    assert run_options(parse_system("lengthwise:ssjf+slo.enforce=true"), args, "s").headers == {}
    assert run_options(parse_system("vllm"), args, "s").headers["x-llm-d-slo-ttft-ms"] == "1000"
    with pytest.raises(SystemExit, match="lengthwise:fcfs not in --systems"):
        main(["sweep", "--engine-kind", "sim", "--client", "ours", "--systems",
              "lengthwise:ssjf", "--capacity", "20", "--send-slo", "--slo-ttft", "1",
              "--send-slo-except", "lengthwise:fcfs", "--out", str(tmp_path / "out")])
