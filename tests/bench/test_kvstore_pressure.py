"""bench/kvstore_pressure.py without an engine: systems, their servers' settings, the output."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.kvstore_pressure import build_parser, rotated, row, summary, system
from bench.servers import command, environment
from daemon import config


def test_systems_default_to_all_three_and_reject_unknown_or_repeated() -> None:
    parser = build_parser()
    assert parser.parse_args([]).systems == ["offload", "drop", "vllm"]
    assert parser.parse_args(["--systems", "vllm, offload"]).systems == ["vllm", "offload"]
    for bad in ("offload,sglang", "drop,drop", ","):
        with pytest.raises(SystemExit):
            parser.parse_args(["--systems", bad])


def test_order_rotates_per_repetition() -> None:
    systems = ["offload", "drop", "vllm"]
    assert [rotated(systems, k) for k in range(4)] == [
        ["offload", "drop", "vllm"], ["drop", "vllm", "offload"],
        ["vllm", "offload", "drop"], ["offload", "drop", "vllm"]]


def test_all_systems_get_the_same_engine_settings(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    args = build_parser().parse_args(["--blocks", "17", "--max-running", "3"])
    commands = {}
    for name in ("offload", "drop", "vllm"):
        (tmp_path / name).mkdir()
        commands[name] = command(*system(args, name), 8000, tmp_path / name)
        env = environment(system(args, name)[1])
        assert env["VLLM_CPU_OMP_THREADS_BIND"] == args.cpu_bind != ""
        assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
        assert env[config.BENCH_KNOBS_ENV] == "1"  # alise's tuning, trust_budget
    monkeypatch.setenv(config.BENCH_KNOBS_ENV, "1")  # as the daemon started by the bench
    cmd = commands["vllm"]
    assert cmd[cmd.index("--num-gpu-blocks-override") + 1] == "17"
    assert cmd[cmd.index("--max-num-seqs") + 1] == "3"
    assert cmd[cmd.index("--dtype") + 1] == "float32"
    assert "--enable-prefix-caching" in cmd
    for name in ("offload", "drop"):
        daemon = config.load(commands[name][-1])  # `lengthwise serve --config PATH`
        vllm_args = daemon.engine.engine_args()
        assert vllm_args["num_gpu_blocks_override"] == 17
        assert daemon.engine.max_num_seqs == daemon.scheduler.max_running == 3
        assert vllm_args["enable_prefix_caching"] and vllm_args["dtype"] == "float32"
        assert daemon.engine.cpu_kv_cache_gib == 1 and daemon.kvstore.enabled
        assert daemon.scheduler.policy == "alise"
        alise = daemon.policies.alise  # type: ignore[attr-defined]  # built from the registry
        assert alise.offload == (name == "offload") and alise.max_resident_jobs == 0


def test_rows_say_n_a_and_summary_gives_median_with_range() -> None:
    vllm = row(0, "vllm", {"mean_jct_s": 2.0, "p99_jct_s": 9.0, "engine_preemptions_total": 3})
    assert "mean_jct_s=2 " in vllm and "engine_preemptions_total=3 " in vllm
    assert "resume_total=n/a" in vllm and "kvstore_saved_tokens_total=n/a" in vllm
    runs = [{"mean_jct_s": m, "p99_jct_s": 10 * m} for m in (3.0, 1.0, 2.0)]
    assert summary({"drop": runs}) == [
        "median of 3 drop    mean_jct_s=2 (1-3) p99_jct_s=20 (10-30)"]
