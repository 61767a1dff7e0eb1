"""`bench compare --repeats`: alternating order, medians with min-max, table and plots."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from bench.compare import RunRecord, aggregate, run_order
from bench.metrics import RequestResult, summarize
from bench.plots import plot_all
from bench.report import markdown_table, ratio_table
from bench.servers import Settings, _lengthwise_config, command, environment, parse_system


def test_systems_alternate_within_each_repetition() -> None:
    systems = [parse_system(s) for s in ("vllm", "lengthwise:fcfs", "lengthwise:ssjf")]
    order = [(k, s.spec) for k, s in run_order(systems, 2)]
    assert order == [(0, "vllm"), (0, "lengthwise:fcfs"), (0, "lengthwise:ssjf"),
                     (1, "lengthwise:fcfs"), (1, "lengthwise:ssjf"), (1, "vllm")]


def test_a_second_vllm_server_is_an_a_a_under_its_own_name(tmp_path: Path) -> None:
    """`vllm#2` starts the same server as `vllm`: two runs of one baseline per draw."""
    again, vllm = parse_system("vllm#2"), parse_system("vllm")
    assert again.kind == "vllm" and again.spec != vllm.spec and again.label != vllm.label
    settings = Settings(model=Path("m"))
    assert command(again, settings, 1, tmp_path) == command(vllm, settings, 1, tmp_path)
    with pytest.raises(ValueError, match="unknown system"):
        parse_system("vllm2")


def _run(system: str, repeat: int, jct: float) -> RunRecord:
    reqs = [RequestResult(index=i, arrival_s=float(i), prompt_tokens=5, output_tokens=10,
                          ok=True, ttft_s=jct / 4, jct_s=jct) for i in range(4)]
    return RunRecord(system=system, rate=5.0, summary=summarize(reqs), requests=reqs,
                     wall_s=1.0, repeat=repeat)


def test_medians_with_min_max_per_system_and_rate(tmp_path: Path) -> None:
    runs = [_run(s, k, jct) for k, jcts in enumerate([(1.0, 2.0), (3.0, 2.2), (2.0, 2.1)])
            for s, jct in zip(("vllm", "lengthwise:ssjf"), jcts, strict=True)]
    aggs = {a.system: a for a in aggregate(runs)}
    ssjf = aggs["lengthwise:ssjf"]
    assert ssjf.repeats == 3 and len(ssjf.requests) == 12  # every run's requests kept
    assert ssjf.summary.mean_jct == pytest.approx(2.1)  # the median, not the mean
    assert (ssjf.spread["mean_jct"].min, ssjf.spread["mean_jct"].max) == (2.0, 2.2)
    assert ssjf.spread["p50_ttft"].median == pytest.approx(2.1 / 4)
    assert aggs["vllm"].summary.mean_jct == 2.0
    table = markdown_table(list(aggs.values()))
    assert "| lengthwise:ssjf | 4/0 | 2.10 (2.00–2.20) |" in table  # per-run median count
    assert "+5.0 %" in table  # median vs median
    paths = plot_all(list(aggs.values()), tmp_path)
    assert all(p.stat().st_size > 0 for p in paths)


def test_preemptions_are_aggregated_and_the_ratio_table_reads_them() -> None:
    runs = [_run(s, k, jct) for k, jcts in enumerate([(2.0, 1.0), (2.0, 1.2), (2.0, 1.1)])
            for s, jct in zip(("vllm", "lengthwise:blend"), jcts, strict=True)]
    for run in runs:
        run.engine_preemptions = 100.0 + run.repeat if run.system == "vllm" else run.repeat
    aggs = {a.system: a for a in aggregate(runs)}
    blend = aggs["lengthwise:blend"].engine_preemptions
    assert blend is not None and (blend.median, blend.min, blend.max) == (1.0, 0.0, 2.0)
    table = ratio_table(list(aggs.values()))
    assert "| 5 | lengthwise:blend | 0.55x | 0.55x | 0.55x | 1.22x | 1 (0–2) | 0 |" in table
    assert "| 5 | vllm | 1.00x | 1.00x | 1.00x | 1.00x | 101 (100–102) | 0 |" in table


def test_a_lengthwise_system_may_carry_its_own_overrides() -> None:
    system = parse_system("lengthwise:blend+policies.blend.beta=2+scheduler.engine_queue=1"
                          "+scheduler.aging.slowdown=3+server.http=hypercorn")
    assert system.policy == "blend" and system.kind == "lengthwise"
    config = tomllib.loads(_lengthwise_config(system, Settings(model=Path("m")), 1))
    assert config["server"] == {"port": 1, "http": "hypercorn"}
    assert config["scheduler"]["engine_queue"] == 1
    assert config["scheduler"]["aging"] == {"slowdown": 3}
    assert config["policies"]["blend"] == {"beta": 2}
    assert config["scheduler"]["max_running"] == "auto"  # the daemon's default
    # an override of a key the config writes itself replaces it
    eager = parse_system("lengthwise:ssjf+scheduler.max_running=64+server.port=9"
                         "+engine.start_method=spawn+engine.max_num_seqs=8")
    config = tomllib.loads(_lengthwise_config(eager, Settings(model=Path("m")), 1))
    assert config["scheduler"]["max_running"] == 64 and config["server"] == {"port": 9}
    assert config["engine"]["start_method"] == "spawn" and config["engine"]["max_num_seqs"] == 8
    assert config["engine"]["vllm_args"] == {"dtype": "auto"}
    assert "+" not in system.label and ":" not in system.label
    with pytest.raises(ValueError, match="overrides"):
        parse_system("lengthwise:blend+beta")


def test_step_log_turns_on_every_engines_step_lines(tmp_path: Path) -> None:
    """--step-log: vLLM's server gets its flag, lengthwise's engine the same vllm_args key
    (its stat logger writes the lines: tests/executors/test_vllm_engine.py)."""
    logged = Settings(model=Path("m"), step_log=True)
    assert "--enable-logging-iteration-details" in command(parse_system("vllm"), logged, 1,
                                                          tmp_path)
    config = tomllib.loads(_lengthwise_config(parse_system("lengthwise:ssjf"), logged, 1))
    assert config["engine"]["vllm_args"]["enable_logging_iteration_details"] is True
    plain = Settings(model=Path("m"))
    assert "--enable-logging-iteration-details" not in command(parse_system("vllm"), plain, 1,
                                                              tmp_path)
    config = tomllib.loads(_lengthwise_config(parse_system("lengthwise:ssjf"), plain, 1))
    assert "enable_logging_iteration_details" not in config["engine"]["vllm_args"]


def test_vllm_env_reaches_vllms_server_alone() -> None:
    """Settings.vllm_env (a test's vLLM server without a worker process) is not
    lengthwise's: on CPU its engine needs the worker process, where vLLM sets the OpenMP
    environment (vLLM's CPU platform keeps the multiprocess executor unless it is set)."""
    s = Settings(model=Path("m"), vllm_env=(("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),))
    assert environment(s, parse_system("vllm"))["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in environment(
        s, parse_system("lengthwise:ssjf"))


def test_the_table_counts_the_429s_the_server_saw_where_the_client_could_not() -> None:
    """vLLM's client records a 429 without a reason: the table takes the server's count."""
    runs = [_run("lengthwise:ssjf", k, 1.0) for k in range(3)]
    for run, refused in zip(runs, (110.0, 100.0, 121.0), strict=True):
        run.server_refused = refused
    assert "| 110 (100–121) |" in markdown_table(aggregate(runs))
    assert "| 0 |" in markdown_table(aggregate([_run("vllm", 0, 1.0)]))
