"""Sim config overrides decode through the daemon's own config loader."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.sim.cli import add_config_arguments, config_from_args
from bench.sim.overrides import build_config, parse_override, to_toml
from daemon.config import ConfigError


def test_values_are_toml_or_plain_strings() -> None:
    assert parse_override("scheduler.policy=ssjf") == (["scheduler", "policy"], "ssjf")
    assert parse_override("a.b=4") == (["a", "b"], 4)
    assert parse_override("a=0.5") == (["a"], 0.5)
    assert parse_override("a=false") == (["a"], False)
    assert parse_override('a="x=y"') == (["a"], "x=y")
    assert parse_override("engine.devices=[\"a\", \"b\"]") == (["engine", "devices"], ["a", "b"])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_override("scheduler.policy")


def test_dotted_toml_round_trips() -> None:
    import tomllib

    tree = {"a": {"b": 1.5, "c": 'quote " and \\ back', "d": [1, 2]}, "e": True}
    assert tomllib.loads(to_toml(tree)) == tree


def test_overrides_reach_the_config_tree(tmp_path: Path) -> None:
    base = tmp_path / "base.toml"
    base.write_text('[scheduler]\npolicy = "isrtf"\n[policies.isrtf]\nmargin = 2.0\n')
    config = build_config(base, ["policies.isrtf.margin=0.5",
                                 "scheduler.aging.promote_after_s=4"])
    assert config.scheduler.policy == "isrtf"  # from the file
    assert config.policies.isrtf.margin == 0.5  # the override wins
    assert config.scheduler.aging.promote_after_s == 4.0
    assert config.scheduler.max_waiting >= 10**9 and config.engine.kind == "sim"


@pytest.mark.parametrize("item,named", [
    ("scheduler.polcy=ssjf", "polcy"),
    ("scheduler.max_running=lots", "scheduler.max_running"),
    ("scheduler.policy=nope", "scheduler.policy"),
    ("policies.isrtf.margin=-1", "policies.isrtf.margin"),
])
def test_bad_overrides_are_refused_by_name(item: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        build_config(overrides=[item])


def test_shorthands_are_overrides(tmp_path: Path) -> None:
    p = argparse.ArgumentParser()
    add_config_arguments(p)
    short = p.parse_args(["--policy", "ssjf", "--max-running", "16", "--promote-after", "4",
                          "--no-aging"])
    long = p.parse_args(["--set", "scheduler.policy=ssjf", "--set", "scheduler.max_running=16",
                         "--set", "scheduler.aging.promote_after_s=4",
                         "--set", "scheduler.aging.enabled=false"])
    assert config_from_args(short) == config_from_args(long)
    assert config_from_args(short).scheduler.max_running == 16
    # --set comes last: it wins over a shorthand
    both = p.parse_args(["--policy", "ssjf", "--set", "scheduler.policy=alise"])
    assert config_from_args(both).scheduler.policy == "alise"


def test_sim_items_set_the_simulated_engine_not_the_config(tmp_path: Path) -> None:
    from bench.sim.cli import sim_from_args
    from daemon.executors.settings import SimConfig

    p = argparse.ArgumentParser()
    add_config_arguments(p)
    profile = Path(__file__).resolve().parents[3] / "bench" / "profiles" / "tiny-llama-cpu.json"
    args = p.parse_args(["--profile", str(profile), "--set", "sim.decode_base_s=0.5",
                         "--set", "scheduler.trust_budget=false"])  # a benchmark knob: fine
    config = config_from_args(args)
    assert not config.scheduler.trust_budget
    sim = sim_from_args(args, config)
    assert sim.decode_base_s == 0.5  # --set wins over the profile
    assert sim.prefill_base_s != SimConfig().prefill_base_s  # the rest is the profile's
    bad = p.parse_args(["--set", "sim.decode_base_s=-1"])
    with pytest.raises(ConfigError, match=r"sim\.decode_base_s = -1: Expected `float` >= 0"):
        sim_from_args(bad, config_from_args(bad))
