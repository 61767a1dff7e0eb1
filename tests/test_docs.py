"""The docs hold together: every relative link and `docs/....md` mention resolves (anchors
included), reference pages carry no dated runs (those live in docs/results/), and every
record says when, where and how it was measured and is listed in the records' index."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RESULTS = DOCS / "results"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), *sorted(RESULTS.glob("*.md"))]
REFERENCE = sorted(DOCS.glob("*.md"))
RECORDS = sorted(p for p in RESULTS.glob("*.md") if p.name != "README.md")

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_MENTION = re.compile(r"(?<![\w/.])docs/[\w./-]+\.md")
_DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
_RECORD_NAME = re.compile(r"20\d\d-[01]\d-[0-3]\d-[a-z0-9]+(-[a-z0-9]+)*\.md")
# `docs/page.md, "Section"`: a page and the start of one of its headings. Records name the
# sections of the day they were written, so only the living pages are checked.
_SECTION_REF = re.compile(r"(docs/[\w-]+\.md)`?,?\s+\(?\"([^\"\n]+)\"")
SECTION_REFS = [ROOT / "README.md", *REFERENCE, ROOT / "etc" / "lengthwise.toml"]


def _prose(text: str) -> str:
    """The text outside fenced code blocks (a link inside one is an example, not a link)."""
    return _FENCE.sub("", text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for line in _prose(page.read_text()).splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            slug, n = _slug(m[1]), 0
            while (slug if n == 0 else f"{slug}-{n}") in found:
                n += 1
            found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def _headings(page: Path) -> list[str]:
    return [m[1] for m in re.finditer(r"^#{1,6} (.+)$", _prose(page.read_text()), re.MULTILINE)]


def _links(page: Path) -> list[str]:
    prose = _CODE_SPAN.sub("", _prose(page.read_text()))
    return [t for t in _LINK.findall(prose) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.name}: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_mentioned_docs_exist(page: Path) -> None:
    missing = {m for m in _MENTION.findall(page.read_text()) if not (ROOT / m).exists()}
    assert not missing, f"{page.name} names {sorted(missing)}"


@pytest.mark.parametrize("page", SECTION_REFS, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_sections_exist(page: Path) -> None:
    """`docs/benchmarks.md, "Benchmark knobs"` names a heading of that page (its start)."""
    stale = []
    for doc, section in _SECTION_REF.findall(page.read_text()):
        target = ROOT / doc
        if target.exists() and not any(h.replace("`", "").startswith(section)
                                       for h in _headings(target)):
            stale.append(f"{doc}, {section!r}")
    assert not stale, f"{page.name}: {stale}"


@pytest.mark.parametrize("page", REFERENCE, ids=lambda p: p.name)
def test_reference_pages_have_no_dated_sections(page: Path) -> None:
    """A dated heading is a record: it belongs in docs/results/, linked from here."""
    dated = [line for line in _prose(page.read_text()).splitlines()
             if line.startswith("#") and _DATE.search(line)]
    assert not dated, f"{page.name}: {dated}"


@pytest.mark.parametrize("record", RECORDS, ids=lambda p: p.name)
def test_records_say_when_where_how(record: Path) -> None:
    text = record.read_text()
    assert _RECORD_NAME.fullmatch(record.name), "name it YYYY-MM-DD-topic.md"
    assert text.startswith("# ")
    for field in ("**Date:**", "**Machine:**", "**Command:**"):
        assert field in text, f"{record.name} lacks {field}"


def test_every_record_is_indexed() -> None:
    index = set(_links(RESULTS / "README.md"))
    assert RECORDS, "no records found"
    assert {p.name for p in RECORDS} <= index, sorted({p.name for p in RECORDS} - index)
