from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from daemon import config
from daemon.config import Config, ConfigError
from daemon.policysetup import make_policy

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "etc" / "lengthwise.toml"
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]* *=", re.MULTILINE)


def _undocumented(node: msgspec.Struct, table: str, text: str) -> list[str]:
    """Operator keys (every field but the benchmark knobs) the file does not show."""
    missing = []
    knobs = config.bench_knob_keys()
    for field in msgspec.structs.fields(type(node)):
        value = getattr(node, field.name)
        name = f"{table}.{field.name}".lstrip(".")
        if isinstance(value, msgspec.Struct):
            if f"[{name}]" not in text and f"[{name}." not in text:
                if not _all_knobs(value, name, knobs):
                    missing.append(f"[{name}]")
                continue
            missing += _undocumented(value, name, text)
        elif name not in knobs and f"\n{field.name} = " not in text:
            missing.append(name)
    return missing


def _all_knobs(node: msgspec.Struct, table: str, knobs: tuple[str, ...]) -> bool:
    return all(f"{table}.{f.name}" in knobs for f in msgspec.structs.fields(type(node)))


def test_shipped_file_is_valid_and_documents_every_operator_key() -> None:
    loaded = config.load(SHIPPED)
    assert loaded == Config()  # the file shows the defaults
    assert _undocumented(Config(), "", SHIPPED.read_text()) == []


def test_shipped_file_has_at_most_47_keys_each_commented() -> None:
    """What an operator sets, and only that: loading it without LENGTHWISE_BENCH_KNOBS
    (above) proves that no benchmark knob is among them."""
    keys = [line for line in SHIPPED.read_text().splitlines() if _KEY.match(line)]
    assert len(keys) <= 47
    assert [line for line in keys if "#" not in line] == []


@pytest.mark.parametrize(("text", "names"), [
    ("[server]\nprot = 8000\n", "server.prot: unknown key"),
    ("[scheduler]\nmax_running = 'four'\n", "scheduler.max_running = 'four': Invalid enum value"),
    ("[nonsense]\n", "nonsense: unknown key"),
    ("[scheduler]\npolicy = 'lifo'\n", "scheduler.policy"),
    ("[scheduler]\nmax_running = 9\n", "scheduler.max_running must be <= engine.max_num_seqs"),
    ("[scheduler]\nmax_running = 0\n", "scheduler.max_running = 0: Expected `int` >= 1"),
    ("[scheduler.aging]\nslowdown = -1\n", "scheduler.aging.slowdown = -1: Expected `float` >= 0"),
    ("[scheduler.aging]\npromote_after_s = 0\n", "scheduler.aging.promote_after_s = 0: "),
    ("[server]\nport = 70000\n", "server.port = 70000: Expected `int` <= 65535"),
    ("[engine]\ncpu_kv_cache_gib = 0\n", "engine.cpu_kv_cache_gib = 0: Expected `int` >= 1"),
    ("[engine]\ndevices = ['cpu', 'gpu0']\n", "engine.devices[1] = 'gpu0': Expected `str` matching"),
    ("[engine]\ndevices = []\n", "engine.devices = []: Expected `array` of length >= 1"),
    ("[engine]\ngpu_memory_utilization = 1.5\n", "engine.gpu_memory_utilization = 1.5"),
    ("[engine]\nvllm_args = { max_num_seqs = 4 }\n", "engine.vllm_args.max_num_seqs: set by lengthwise"),
    ("[kvstore]\nquantization = 'fp8'\n", "kvstore.quantization = 'fp8': Invalid enum value"),
    ("[kvstore]\ncapacity_bytes = -1\n", "kvstore.capacity_bytes = -1: Expected `int` >= 0"),
    ("[predictor]\nthreads = 0\n", "predictor.threads = 0: Expected `int` >= 1"),
    ("[limits]\npriority_range = [5, 1]\n", "limits.priority_range must be [min, max]"),
    ("[log]\nlevel = 'loud'\n", "log.level = 'loud': Invalid enum value"),
    ("[server]\nhttp = 'h2'\n", "server.http = 'h2': Invalid enum value"),
    ("[slo]\nclasses = { gold = { ttft_ms = 1 } }\n", "slo.classes.gold: a class is a request"),
    ("[slo]\nclasses = { 0 = { ttft_ms = -1 } }\n", "slo.classes[...].ttft_ms: Expected `float` > 0"),
    ("[slo]\nclasses = { 0 = { ttft = 1 } }\n", "ttft"),
    ("[server\n", "malformed TOML"),
])
def test_bad_files_name_the_key(text: str, names: str) -> None:
    with pytest.raises(ConfigError) as info:
        config.decode(text, "test.toml")
    assert names in str(info.value)
    assert "test.toml" in str(info.value)


@pytest.mark.parametrize("text", [
    # [sim] left the daemon: the simulated engine runs [costmodel] profile (or the generic
    # model); the simulator takes its costs as options (--profile, --set sim.KEY=V).
    "[sim]\ndecode_base_s = 0.01\n",
    # Rarely set vLLM arguments are [engine] vllm_args entries now.
    "[model]\ndtype = 'float32'\n",
    "[engine]\nnum_gpu_blocks_override = 40\n",
    "[engine]\nenforce_eager = false\n",
    "[engine]\nenable_prefix_caching = false\n",
])
def test_removed_keys_are_unknown(text: str) -> None:
    with pytest.raises(ConfigError, match="unknown key"):
        config.decode(text)


@pytest.mark.parametrize("text", [
    "[scheduler]\ntrust_budget = false\n",
    "[scheduler]\nplacement = 'least_queue'\n",
    "[scheduler]\ncalibrate_lengths = false\n",
    "[scheduler.aging]\nlookahead = false\n",
    "[scheduler.aging]\nenabled = false\n",
    "[engine]\nstart_method = 'spawn'\n",
    "[policies.scls]\nslicing = 'always'\n",
    "[policies.scls]\nkv_capacity_tokens = 4096\n",
    "[policies.alise]\nmargin = 0.5\n",
    "[predictor]\nmax_batch = 8\n",
])
def test_benchmark_knobs_are_refused_in_an_operators_file_only(text: str) -> None:
    with pytest.raises(ConfigError, match="unknown key \\(a benchmark knob"):
        config.decode(text)
    config.decode(text, bench_knobs=True)  # bench commands' configs


def test_benchmark_knobs_keep_their_constraints() -> None:
    with pytest.raises(ConfigError, match="scheduler.placement = 'random': Invalid enum"):
        config.decode("[scheduler]\nplacement = 'random'\n", bench_knobs=True)
    with pytest.raises(ConfigError, match="scheduler.aging.min_wait_s must be <= promote_after_s"):
        config.decode("[scheduler.aging]\nmin_wait_s = 100\n", bench_knobs=True)


def test_the_environment_lets_a_bench_daemon_load_knobs(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "bench.toml"
    path.write_text("[scheduler]\ntrust_budget = false\n")
    with pytest.raises(ConfigError, match="scheduler.trust_budget: unknown key"):
        config.load(path)
    monkeypatch.setenv(config.BENCH_KNOBS_ENV, "1")
    assert not config.load(path).scheduler.trust_budget


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        config.load(tmp_path / "absent.toml")


def test_restart_only_changes_are_named() -> None:
    old = Config()
    new = config.decode("[server]\nport = 9000\n[scheduler]\nmax_running = 2\n")
    assert config.restart_only_changes(old, new) == ["server"]
    # The HTTP server is chosen once, at start (daemon/httpserver.py).
    hypercorn = config.decode("[server]\nhttp = 'hypercorn'\n")
    assert hypercorn.server.http == "hypercorn" and old.server.http == "uvicorn"
    assert config.restart_only_changes(old, hypercorn) == ["server"]
    # Each engine loads its KV connector at start: kvstore changes need a restart.
    kv = config.decode("[kvstore]\nenabled = true\nquantization = 'none'\n")
    assert kv.kvstore.enabled and kv.kvstore.quantization == "none"
    assert config.restart_only_changes(old, kv) == ["kvstore"]


def test_tree_is_frozen() -> None:
    with pytest.raises(AttributeError):
        Config().scheduler.max_running = 3  # type: ignore[misc]


def test_costmodel_profile_drives_policies_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    from policies import registry

    shipped = ROOT / "bench" / "profiles" / "tiny-llama-cpu-stack.json"
    loaded = config.decode(f'[costmodel]\nprofile = "{shipped}"\n')
    policy = make_policy(loaded, "ssjf")
    fitted = msgspec.json.decode(shipped.read_bytes())["sim"]
    assert policy.cost.decode_base_s == fitted["decode_base_s"]
    assert config.cost_profile(loaded).decode_base_s == fitted["decode_base_s"]  # sim engine
    assert registry.create("ssjf").cost.decode_base_s == config.SimConfig().decode_base_s
    bad = tmp_path / "bad.json"
    bad.write_text('{"sim": {"decode_base_s": "fast"}}')
    for path in (bad, tmp_path / "missing.json"):
        with pytest.raises(ConfigError, match="costmodel.profile"):
            config.decode(f'[costmodel]\nprofile = "{path}"\n')


def test_rooms_own_their_settings_and_config_modules_form_no_cycle() -> None:
    """The core's settings import nothing from daemon/; the config tree imports the rooms'
    settings, the API keys and the cost model, and none of those imports the tree."""
    code = ("import sys, daemon.core.settings, daemon.executors.settings, daemon.apikeys; "
            "sys.exit(sorted(m for m in sys.modules if m.startswith(('daemon.config', "
            "'policies', 'daemon.http', 'daemon.service'))) != [])")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
    settings = (ROOT / "daemon" / "core" / "settings.py").read_text()
    assert not re.search(r"^\s*(from|import) daemon", settings, re.MULTILINE)


def test_oracle_policies_are_for_benchmarks() -> None:
    for policy in ("oracle-sjf", "oracle-srpt"):
        text = f'[scheduler]\npolicy = "{policy}"\n'
        with pytest.raises(ConfigError, match=f"scheduler.policy '{policy}' needs true lengths"):
            config.decode(text)
        assert config.decode(text, bench_knobs=True).scheduler.policy == policy
