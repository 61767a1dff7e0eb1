"""The policy registry: names to classes, each policy's own config section, fresh policies
built with their parameters, cost model and batch size."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from daemon.config import PoliciesConfig, decode
from daemon.core.costmodel import CostModel
from daemon.core.policy import class_rank
from daemon.policysetup import make_policy
from policies import registry
from policies.alise import ALISEParams
from policies.blend import BlendParams
from policies.isrtf import ISRTF, ISRTFParams
from policies.scls import SCLSParams

ROOT = Path(__file__).resolve().parents[2]


def test_policies_own_their_sections_and_never_import_the_daemon_config() -> None:
    sections = registry.sections()
    assert sections == {"isrtf": ISRTFParams, "alise": ALISEParams, "scls": SCLSParams,
                        "blend": BlendParams}
    assert {f.name: f.type for f in msgspec.structs.fields(PoliciesConfig)} == sections
    code = ("import sys, policies.registry, policies.ssjf; "
            "sys.exit('daemon.config' in sys.modules)")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_registry_builds_every_policy_from_config() -> None:
    assert registry.names() == sorted(
        ["fcfs", "ssjf", "hrrn", "isrtf", "alise", "scls", "blend", "oracle-sjf",
         "oracle-srpt", "oracle-blend"])
    loaded = decode('[policies.isrtf]\nmax_preemptions = 5\n[scheduler]\npolicy = "isrtf"\n',
                    bench_knobs=True)
    assert make_policy(loaded, "isrtf").max_preemptions == 5
    for name in registry.names():
        assert registry.create(name).name == name
    with pytest.raises(ValueError, match="unknown policy"):
        registry.create("lifo")
    assert class_rank(1, 42.7) == 1_000_042 and class_rank(0, 1e12) == 999_999


def test_only_the_oracles_are_benchmark_only() -> None:
    assert [name for name in registry.names() if registry.benchmark_only(name)] == [
        "oracle-blend", "oracle-sjf", "oracle-srpt"]
    with pytest.raises(ValueError, match=r"unknown policy 'lifo'; known: \[.alise., .blend., "):
        registry.benchmark_only("lifo")


def test_create_hands_the_policy_its_parameters_cost_model_and_batch_size() -> None:
    cost = CostModel(decode_base_s=0.002)
    policy = registry.create("isrtf", ISRTFParams(window_tokens=7), cost, max_running=3)
    assert isinstance(policy, ISRTF)
    assert policy.window_tokens == 7
    assert policy.cost is cost and policy.batch_hint == 3
    default = registry.create("isrtf")
    assert default.cost == CostModel() and default.batch_hint == 4
    # oracle-srpt reads isrtf's section: one [policies.isrtf] serves both.
    assert registry.policy_class("oracle-srpt").params_section == "isrtf"
