"""The executors' settings: engine arguments over lengthwise's defaults, device names and the
cores a CPU engine is bound to."""

from __future__ import annotations

import msgspec
import pytest

from daemon import config
from daemon.executors.settings import EngineConfig, cpu_cores


def test_vllm_args_pass_through_over_lengthwise_defaults() -> None:
    loaded = config.decode('[engine]\nvllm_args = { dtype = "float32", enforce_eager = false,'
                           ' num_gpu_blocks_override = 40 }\n')
    assert loaded.engine.engine_args() == {"enforce_eager": False, "enable_prefix_caching": True,
                                           "dtype": "float32", "num_gpu_blocks_override": 40}


def test_cpu_devices_name_their_cores_in_linux_cpu_list_syntax() -> None:
    assert cpu_cores("cpu:0-3,8") == [0, 1, 2, 3, 8]
    assert cpu_cores("cpu:6,4") == [6, 4]  # in the order named
    assert cpu_cores("cpu:5") == [5]
    assert cpu_cores("cpu") is None  # vLLM binds its threads itself
    assert cpu_cores("cuda:0") is None


@pytest.mark.parametrize("device", ["cpu", "cpu:0-3,8", "cpu:2", "cuda:0", "cuda:12"])
def test_device_names_accepted(device: str) -> None:
    assert msgspec.convert({"devices": [device]}, EngineConfig).devices == [device]


@pytest.mark.parametrize("device", ["gpu0", "cpu:", "cpu:0-", "cpu:a", "cuda", "cuda:x", "CPU"])
def test_device_names_refused(device: str) -> None:
    with pytest.raises(msgspec.ValidationError, match="Expected `str` matching"):
        msgspec.convert({"devices": [device]}, EngineConfig)
