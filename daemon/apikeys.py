"""API keys from `[server] api_keys_file` (re-read on SIGHUP), compared in constant time.

One key per line, then optional `name=`, `priority=MIN..MAX`, `scope=` and latency-objective
(`ttft_ms=`, `tpot_ms=`, `sheddable=true|false`) words; `#` starts a comment:

    sk-3f9c0d...  name=batch-team  priority=0..100  sheddable=true
    sk-77aa01...  name=ops         priority=-100..100  ttft_ms=500 tpot_ms=50
    sk-0b5e22...  name=prometheus  scope=monitoring

A key without `priority=` may use 0..max of limits.priority_range only: lower (more urgent) classes
need a key that names them. `scope` is `api` (the /v1 endpoints, the default), `monitoring`
(/metrics and /health when `server.protect_monitoring` is on) or `all`. The objective is the
default of the key's requests (a request's x-llm-d-slo-* headers win: daemon/http/slo.py).
"""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Annotated, Literal, cast

import msgspec

Scope = Literal["api", "monitoring", "all"]
_SCOPES = ("api", "monitoring", "all")
MAX_OBJECTIVE_MS = 3_600_000.0  # an hour: any longer objective is a mistake
_Millis = Annotated[float, msgspec.Meta(gt=0, le=MAX_OBJECTIVE_MS)]


class Objective(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A latency objective as configured: first token within ttft_ms, then at most tpot_ms
    per output token; sheddable: dropped rather than served late, and first when a more
    urgent request needs its room."""

    ttft_ms: _Millis | None = None
    tpot_ms: _Millis | None = None
    sheddable: bool = False


class KeyFileError(ValueError):
    """A keys file that cannot be used; the message names the file and the line."""


class ApiKey(msgspec.Struct, frozen=True):
    name: str
    # Allowed request priorities; None = the default range (0..max of limits.priority_range).
    priority_range: tuple[int, int] | None = None
    scope: Scope = "api"
    objective: Objective | None = None  # default latency objective of its requests

    def allows(self, scope: Scope) -> bool:
        return self.scope in (scope, "all")


class KeyRing:
    def __init__(self, keys: dict[str, ApiKey]) -> None:
        self._keys = [(secret.encode(), key) for secret, key in keys.items()]

    def __len__(self) -> int:
        return len(self._keys)

    def lookup(self, secret: str) -> ApiKey | None:
        """The key for `secret`; every stored key is compared, each in constant time, so the
        answer's timing does not depend on which key (or how much of one) matched."""
        given = secret.encode()
        found: ApiKey | None = None
        for stored, key in self._keys:
            if hmac.compare_digest(stored, given):
                found = key
        return found


def load(path: str) -> KeyRing:
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"{path}: cannot read: {exc}") from None
    keys: dict[str, ApiKey] = {}
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        try:
            secret, key = _parse(words, number)
        except ValueError as exc:
            raise KeyFileError(f"{path}:{number}: {exc}") from None
        if secret in keys:
            raise KeyFileError(f"{path}:{number}: key {key.name!r} repeats an earlier key")
        keys[secret] = key
    return KeyRing(keys)


def _parse(words: list[str], number: int) -> tuple[str, ApiKey]:
    secret, options = words[0], dict(_option(word) for word in words[1:])
    if len(secret) < 16 or "=" in secret:
        raise ValueError("a key comes first and has at least 16 characters")
    unknown = set(options) - {"name", "priority", "scope", *_OBJECTIVE}
    if unknown:
        raise ValueError(f"unknown option {min(unknown)!r} (name, priority, scope, "
                         f"{', '.join(_OBJECTIVE)})")
    span: tuple[int, int] | None = None
    if "priority" in options:
        low, sep, high = options["priority"].partition("..")
        span = (int(low), int(high))
        if not sep or span[0] > span[1]:
            raise ValueError("priority must be MIN..MAX with MIN <= MAX")
    scope = options.get("scope", "api")
    if scope not in _SCOPES:
        raise ValueError(f"scope must be one of {_SCOPES}")
    return secret, ApiKey(options.get("name", f"line {number}"), span, cast(Scope, scope),
                          _objective(options))


_OBJECTIVE = ("ttft_ms", "tpot_ms", "sheddable")


def _objective(options: dict[str, str]) -> Objective | None:
    given = {name: options[name] for name in _OBJECTIVE if name in options}
    if not given:
        return None
    if given.get("sheddable", "false") not in ("true", "false"):
        raise ValueError("sheddable must be true or false")
    try:
        return msgspec.convert({name: value == "true" if name == "sheddable" else float(value)
                                for name, value in given.items()}, Objective)
    except (ValueError, msgspec.ValidationError) as exc:
        raise ValueError(f"latency objective: {exc} (milliseconds, > 0, <= "
                         f"{MAX_OBJECTIVE_MS:.0f})") from None


def _option(word: str) -> tuple[str, str]:
    name, sep, value = word.partition("=")
    if not sep or not value:
        raise ValueError(f"expected name=value, got {word!r}")
    return name, value
