from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from daemon import config
from daemon.config import Config, ConfigError
from daemon.policysetup import make_policy

SHIPPED = Path(__file__).resolve().parents[1] / "etc" / "lengthwise.toml"


def _undocumented(node: msgspec.Struct, table: str, text: str) -> list[str]:
    missing = []
    for field in msgspec.structs.fields(type(node)):
        value = getattr(node, field.name)
        name = f"{table}.{field.name}".lstrip(".")
        if isinstance(value, msgspec.Struct):
            if f"[{name}]" not in text and f"[{name}." not in text:
                missing.append(f"[{name}]")
            missing += _undocumented(value, name, text)
        elif f"\n{field.name} = " not in text:
            missing.append(name)
    return missing


def test_shipped_file_is_valid_and_documents_every_key() -> None:
    loaded = config.load(SHIPPED)
    assert loaded == Config()  # the file shows the defaults
    assert _undocumented(Config(), "", SHIPPED.read_text()) == []


@pytest.mark.parametrize(("text", "names"), [
    ("[server]\nprot = 8000\n", "prot"),
    ("[scheduler]\nmax_running = 'four'\n", "$.scheduler.max_running"),
    ("[nonsense]\n", "nonsense"),
    ("[scheduler]\npolicy = 'lifo'\n", "scheduler.policy"),
    ("[scheduler]\nmax_running = 9\n", "scheduler.max_running"),
    ("[scheduler]\nplacement = 'random'\n", "scheduler.placement"),
    ("[engine]\ncpu_kv_cache_gib = 0\n", "engine.cpu_kv_cache_gib"),
    ("[engine]\ndevices = ['cpu', 'gpu0']\n", "engine.devices: 'gpu0'"),
    ("[kvstore]\nquantization = 'fp8'\n", "$.kvstore.quantization"),
    ("[kvstore]\ncapacity_bytes = -1\n", "kvstore.capacity_bytes"),
    ("[engine]\nnum_gpu_blocks_override = -1\n", "engine.num_gpu_blocks_override"),
    ("[server\n", "malformed TOML"),
])
def test_bad_files_name_the_key(text: str, names: str) -> None:
    with pytest.raises(ConfigError) as info:
        config.decode(text, "test.toml")
    assert names in str(info.value)
    assert "test.toml" in str(info.value)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        config.load(tmp_path / "absent.toml")


def test_restart_only_changes_are_named() -> None:
    old = Config()
    new = config.decode("[server]\nport = 9000\n[scheduler]\nmax_running = 2\n")
    assert config.restart_only_changes(old, new) == ["server"]
    # Each engine loads its KV connector at start: kvstore changes need a restart.
    kv = config.decode("[kvstore]\nenabled = true\nquantization = 'none'\n")
    assert kv.kvstore.enabled and kv.kvstore.quantization == "none"
    assert config.restart_only_changes(old, kv) == ["kvstore"]


def test_tree_is_frozen() -> None:
    with pytest.raises(AttributeError):
        Config().scheduler.max_running = 3  # type: ignore[misc]


def test_costmodel_profile_drives_policies_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    from policies import registry

    root = Path(__file__).resolve().parents[1]
    shipped = root / "bench" / "profiles" / "tiny-llama-cpu-stack.json"
    loaded = config.decode(f'[costmodel]\nprofile = "{shipped}"\n')
    policy = make_policy(loaded, "ssjf")
    fitted = msgspec.json.decode(shipped.read_bytes())["sim"]
    assert policy.cost.decode_base_s == fitted["decode_base_s"]
    assert registry.create("ssjf").cost.decode_base_s == config.SimConfig().decode_base_s
    bad = tmp_path / "bad.json"
    bad.write_text('{"sim": {"decode_base_s": "fast"}}')
    for path in (bad, tmp_path / "missing.json"):
        with pytest.raises(ConfigError, match="costmodel.profile"):
            config.decode(f'[costmodel]\nprofile = "{path}"\n')


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
