"""A policy built from a Config: its [policies.*] section, the cost model, max_running and
the configured placement; a warning when offload has no kvstore to go to."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon import config
from daemon.config import decode
from daemon.core.costmodel import CostModel
from daemon.policysetup import make_policy
from policies.alise import ALISE
from tests.policies.fakes import job, work_vs_queue_pair

PROFILE = Path(__file__).resolve().parents[1] / "bench" / "profiles" / "tiny-llama-cpu-stack.json"


@pytest.mark.parametrize("policy", ["fcfs", "ssjf", "alise"])
def test_make_policy_applies_the_configured_placement(policy: str) -> None:
    a, b = work_vs_queue_pair()
    own = make_policy(decode(f'[scheduler]\npolicy = "{policy}"\n'))
    assert own.placement is None
    assert own.choose_executor(job("n"), [a, b]) is b  # least predicted outstanding work
    text = f'[scheduler]\npolicy = "{policy}"\nplacement = "least_queue"\n'
    routed = make_policy(decode(text, bench_knobs=True))  # the fleet benchmark's knob
    assert routed.choose_executor(job("n"), [a, b]) is a


@pytest.mark.parametrize("policy", ["alise", "isrtf"])
def test_offload_without_kvstore_is_warned_about(policy: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    off = f'[scheduler]\npolicy = "{policy}"\n[policies.{policy}]\noffload = true\n'
    with caplog.at_level("WARNING", logger="daemon.policysetup"):
        make_policy(config.decode(off))
        assert f"policies.{policy}.offload is on but [kvstore] is not enabled" in caplog.text
        caplog.clear()
        make_policy(config.decode(off + "[kvstore]\nenabled = true\n"))
        make_policy(config.decode(f'[scheduler]\npolicy = "{policy}"\n'))
    assert not caplog.text


def test_the_config_names_the_policy_its_section_and_batch_size() -> None:
    loaded = decode('[scheduler]\npolicy = "alise"\nmax_running = 3\n'
                    '[policies.alise]\nmax_resident_jobs = 7\n', bench_knobs=True)
    policy = make_policy(loaded)
    assert isinstance(policy, ALISE)
    assert policy.params.max_resident_jobs == 7 and policy.batch_hint == 3
    assert make_policy(loaded, "fcfs").name == "fcfs"  # a name given wins over the config's


def test_the_cost_model_given_wins_over_the_configs() -> None:
    loaded = decode(f'[costmodel]\nprofile = "{PROFILE}"\n')
    assert make_policy(loaded).cost == config.cost_model(loaded) != CostModel()
    engine = CostModel(decode_base_s=0.002)  # the simulator's own engine
    assert make_policy(loaded, cost=engine).cost is engine
