"""Systems of a frontier: LABEL=KEY=VALUE,KEY=VALUE (each KEY=VALUE a config override)."""

from __future__ import annotations

import msgspec

BASELINE = "fcfs"

# The systems issue 10 measures: the absolute-aging sweep of ssjf and of oracle SJF (60 s is
# the shipped default), and every other policy at its defaults.
_AGES = (1, 2, 4, 8, 60)
DEFAULT_SYSTEMS = (
    [f"ssjf-age{a}=scheduler.policy=ssjf,scheduler.aging.promote_after_s={a}" for a in _AGES]
    + [f"oracle-sjf-age{a}=scheduler.policy=oracle-sjf,scheduler.aging.promote_after_s={a}"
       for a in _AGES]
    + [f"{p}=scheduler.policy={p}" for p in ("isrtf", "alise", "scls")])


class System(msgspec.Struct, frozen=True):
    label: str
    overrides: list[str]


def parse_system(text: str) -> System:
    """'ssjf-age4=scheduler.policy=ssjf,scheduler.aging.promote_after_s=4'. A bare policy
    name ('isrtf') is short for 'isrtf=scheduler.policy=isrtf'."""
    label, sep, rest = text.partition("=")
    if not label:
        raise ValueError(f"system {text!r}: expected LABEL=KEY=VALUE,KEY=VALUE")
    if not sep:
        return System(label, [f"scheduler.policy={label}"])
    return System(label, [item for item in rest.split(",") if item])


def with_baseline(systems: list[System]) -> list[System]:
    """FCFS first, always: every ratio is to it."""
    rest = [s for s in systems if s.label != BASELINE]
    base = next((s for s in systems if s.label == BASELINE),
                System(BASELINE, [f"scheduler.policy={BASELINE}"]))
    return [base, *rest]


def group_of(label: str) -> str:
    """Systems sharing the part before the last '-' form one curve (ssjf-age1, ssjf-age2)."""
    head, sep, _ = label.rpartition("-")
    return head if sep else label
