"""Systems of a frontier: LABEL=KEY=VALUE,KEY=VALUE (each KEY=VALUE a config override)."""

from __future__ import annotations

import msgspec

BASELINE = "fcfs"

# The systems issue 10 measures: the tail knob (scheduler.aging.slowdown, with the look-ahead
# guard, as shipped) swept for ssjf and for oracle SJF; the simple rules on the same workload
# and predictor (ssjf with an absolute wait threshold and no guard, HRRN on its own); and every
# other policy at its defaults.
_SLOWDOWNS = (1, 2, 4, 6, 8, 12)
_ABSOLUTE_S = (0.5, 1, 2, 4)
DEFAULT_SYSTEMS = (
    [f"ssjf-k{k}=scheduler.policy=ssjf,scheduler.aging.slowdown={k}" for k in _SLOWDOWNS]
    + [f"ssjf-abs-{a}s=scheduler.policy=ssjf,scheduler.aging.slowdown=0,"
       f"scheduler.aging.lookahead=false,scheduler.aging.promote_after_s={a}"
       for a in _ABSOLUTE_S]
    + ["hrrn=scheduler.policy=hrrn,scheduler.aging.enabled=false"]
    + [f"oracle-sjf-k{k}=scheduler.policy=oracle-sjf,scheduler.aging.slowdown={k}"
       for k in (2, 4, 8)]
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
