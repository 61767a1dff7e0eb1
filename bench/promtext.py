"""A server's /metrics text, read with prometheus_client's own parser: the counters the
benchmarks and the tests take from lengthwise's and vLLM's servers."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def families(text: str) -> dict[str, list[Sample]]:
    """Each family's samples by the family's name (a counter's without its `_total`; the
    samples of a name given twice, or without a TYPE line, together)."""
    found: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        found.setdefault(family.name, []).extend(family.samples)
    return found


def _named(text: str, name: str) -> Iterator[Sample]:
    for family in text_string_to_metric_families(text):
        yield from (sample for sample in family.samples if sample.name == name)


def total(text: str, name: str, **labels: str) -> float:
    """Sum of the samples named `name` (a counter's `..._total`, a histogram's `..._sum`)
    that carry every one of `labels` (0 if there is none)."""
    return sum(sample.value for sample in _named(text, name)
               if all(sample.labels.get(key) == value for key, value in labels.items()))


def by_label(text: str, name: str, *labels: str) -> dict[str, float]:
    """The samples named `name` summed per value of their `labels`, the values joined by
    "/" ({} if there is none)."""
    found: dict[str, float] = {}
    for sample in _named(text, name):
        if all(label in sample.labels for label in labels):
            value = "/".join(sample.labels[label] for label in labels)
            found[value] = found.get(value, 0.0) + sample.value
    return found
