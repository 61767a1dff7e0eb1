"""The API keys file: every mistake is a config error naming the file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.apikeys import KeyFileError, Objective, load
from daemon.config import ConfigError


def test_a_good_file(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("sk-0123456789abcdef name=a priority=-3..9 scope=all  # trailing note\n"
                    "\n  sk-fedcba9876543210\n")
    keys = load(str(path))
    assert len(keys) == 2
    first = keys.lookup("sk-0123456789abcdef")
    assert first is not None and first.name == "a" and first.priority_range == (-3, 9)
    assert first.allows("monitoring") and first.allows("api")
    second = keys.lookup("sk-fedcba9876543210")
    assert second is not None and second.name == "line 3" and second.priority_range is None
    assert not second.allows("monitoring")
    assert keys.lookup("sk-0123456789abcde") is None  # a prefix is not the key


@pytest.mark.parametrize(("line", "says"), [
    ("short name=x", "at least 16 characters"),
    ("sk-0123456789abcdef colour=red", "unknown option 'colour'"),
    ("sk-0123456789abcdef priority=a..b", "invalid literal"),
    ("sk-0123456789abcdef scope=root", "scope must be one of"),
    ("sk-0123456789abcdef ttft_ms=-5", "latency objective: .* > 0"),
    ("sk-0123456789abcdef tpot_ms=fast", "latency objective"),
    ("sk-0123456789abcdef sheddable=maybe", "sheddable must be true or false"),
    ("sk-0123456789abcdef name", "expected name=value"),
    ("sk-0123456789abcdef\nsk-0123456789abcdef", "repeats an earlier key"),
])
def test_bad_key_files_name_the_line(tmp_path: Path, line: str, says: str) -> None:
    path = tmp_path / "keys"
    path.write_text("# comment\n" + line + "\n")
    with pytest.raises(KeyFileError, match=says):
        load(str(path))


def test_config_check_reads_the_keys_file(tmp_path: Path) -> None:
    from daemon.config import load as load_config

    keys, config = tmp_path / "keys", tmp_path / "lengthwise.toml"
    keys.write_text("sk-0123456789abcdef scope=everything\n")
    config.write_text(f'[server]\napi_keys_file = "{keys}"\n')
    with pytest.raises(ConfigError, match="keys:1: scope must be one of"):
        load_config(config)


def test_a_key_may_carry_a_latency_objective(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("sk-0123456789abcdef name=ops ttft_ms=500 tpot_ms=40\n"
                    "sk-fedcba9876543210 name=batch sheddable=true\n")
    keys = load(str(path))
    ops, batch = keys.lookup("sk-0123456789abcdef"), keys.lookup("sk-fedcba9876543210")
    assert ops is not None and ops.objective == Objective(ttft_ms=500, tpot_ms=40)
    assert batch is not None and batch.objective == Objective(sheddable=True)
