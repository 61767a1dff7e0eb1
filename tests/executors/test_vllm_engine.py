"""How the vLLM executor's engine is built (daemon/executors/vllm_engine.py): its engine
args, its processes' environment, its KV connector's settings."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from daemon.config import Config, EngineConfig, KVStoreConfig, ModelConfig
from daemon.executors import vllm_engine


def _config(**engine: object) -> Config:
    return Config(model=ModelConfig(path="models/tiny-llama", max_model_len=1024),
                  engine=EngineConfig(**engine))  # type: ignore[arg-type]


def test_engine_args_put_the_operators_vllm_args_over_lengthwises_defaults() -> None:
    args = vllm_engine.engine_args(
        _config(max_num_seqs=8, vllm_args={"enforce_eager": False, "dtype": "float32"}),
        "cpu")
    assert args.max_num_seqs == 8 and args.max_model_len == 1024
    assert args.scheduling_policy == "priority"  # lengthwise's own: vllm_args may not
    assert args.disable_log_stats  # vLLM's loggers off; the StatsRecorder keeps stats
    assert not args.enforce_eager and args.dtype == "float32"  # over the defaults
    assert args.enable_prefix_caching  # a default left alone
    assert args.kv_transfer_config is None


def test_the_kv_connector_reads_the_store_settings_and_decisions_folder() -> None:
    kv = vllm_engine.kv_transfer_config(KVStoreConfig(capacity_bytes=1 << 20), "/tmp/d")
    assert kv.kv_connector == "LengthwiseConnector"
    assert kv.kv_load_failure_policy == "recompute"
    assert kv.kv_connector_extra_config == {"capacity_bytes": 1 << 20,
                                            "quantization": "int8", "decisions_dir": "/tmp/d"}
    args = vllm_engine.engine_args(_config(), "cpu", kv)
    assert args.kv_transfer_config is kv


def test_engine_env_binds_cores_on_cpu_and_one_gpu_on_cuda() -> None:
    config = _config(cpu_kv_cache_gib=3)
    assert vllm_engine.engine_env(config, "cpu:0-1") == {
        "VLLM_CPU_KVCACHE_SPACE": "3", "VLLM_CPU_OMP_THREADS_BIND": "0,1"}
    assert vllm_engine.engine_env(config, "cuda:2") == {"CUDA_VISIBLE_DEVICES": "2"}


class _Sink:
    engine_preemptions = 0
    reported_stats = None

    def kvstore_reported(self, data: object) -> None:
        pass


def test_each_engine_step_is_logged_when_the_operator_asks_vllm_for_it(
        caplog: pytest.LogCaptureFixture) -> None:
    """vllm_args' enable_logging_iteration_details: the engine reports every step, and the
    stat logger writes vLLM's own line for it (vLLM's logger is off); without it, nothing."""
    from vllm.v1.metrics.stats import SchedulerIterationDetails, SchedulerStats

    sink = _Sink()
    config = SimpleNamespace(cache_config=SimpleNamespace(block_size=128, num_gpu_blocks=64))
    recorder = vllm_engine.StatsRecorder(sink, config, "cpu-0")
    caplog.set_level(logging.INFO, logger=vllm_engine.__name__)
    recorder.record(SchedulerStats(num_running_reqs=3, kv_cache_usage=0.5), None)
    assert caplog.messages == [] and sink.reported_stats.num_running_reqs == 3
    step = SchedulerIterationDetails(iteration_index=7, num_ctx_requests=1, num_ctx_tokens=40,
                                     num_generation_requests=3, num_generation_tokens=3,
                                     elapsed_ms=4.25)
    recorder.record(SchedulerStats(num_running_reqs=4, kv_cache_usage=0.5,
                                   iteration_details=step), None)
    assert caplog.messages == [(
        "executor cpu-0: Iteration(7): 1 context requests, 40 context tokens, 3 generation "
        "requests, 3 generation tokens, iteration elapsed time: 4.25 ms, KV cache usage: 50.0%")]
