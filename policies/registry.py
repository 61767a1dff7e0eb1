"""Name -> policy class. The core never names a concrete policy; config does, through here."""

from __future__ import annotations

from daemon.core.policy import Policy
from policies.fcfs import FCFS

_POLICIES: dict[str, type[Policy]] = {cls.name: cls for cls in (FCFS,)}


def names() -> list[str]:
    return sorted(_POLICIES)


def create(name: str) -> Policy:
    try:
        return _POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {names()}") from None
