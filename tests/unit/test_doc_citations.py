"""Design citations in the code point inside the repository, at files and sections that exist.

Every ``docs/…`` file named in ``supervisor/`` exists; every ``§N.N`` written right after a spec file
(``docs/reference/policy.md §3.1, §3.17; …``: up to the end of that clause) is a numbered heading of that spec;
every ``docs/design.md "Name"`` is a heading or a bold lead-in of the design; no module cites the team's
copies outside the repository (``../shared``, ``shared/``, a bare ``DESIGN.md``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.tracked import tracked

ROOT = Path(__file__).resolve().parents[2]
SOURCES = tracked("supervisor")
# tests and benchmarks cite the design too; this file names the forbidden forms on purpose
ALL_PYTHON = [p for p in tracked("supervisor", "tests", "bench", "fuzz") if p != Path(__file__).resolve()]

DOC_PATH = re.compile(r"(?<![\w/.])docs/[\w./-]*\w\.(?:md|yaml|yml)")
SPEC_CLAUSE = re.compile(r"(?<![\w/.])(docs/reference/\w+\.md)([^;)\"\n]*)")
SECTION = re.compile(r"§(\d+(?:\.\d+)*)")
HEADING = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)\.?\s", re.MULTILINE)
DESIGN_NAME = re.compile(r'docs/design\.md "([^"]+)"')
DESIGN = ROOT / "docs" / "design.md"
OUTSIDE = re.compile(r"\.\./shared|(?<![\w/.-])shared/|(?<![\w/.-])DESIGN\.md|(?<![\w/.-])spec/(?:policy|boundary)\.md")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _headings(spec: Path) -> set[str]:
    return set(HEADING.findall(spec.read_text(encoding="utf-8")))


def _design_names() -> set[str]:
    text = DESIGN.read_text(encoding="utf-8")
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", text, re.MULTILINE)
    leads = re.findall(r"\*\*([^*]+?)\.?\*\*", text)
    return {" ".join(name.split()) for name in (*headings, *leads)}


def _cited_name(raw: str) -> str:
    """A name as cited, with a line break inside it (and a comment's ``#``) folded to one space."""
    return " ".join(re.sub(r"\n\s*#?", " ", raw).split())


def test_there_is_something_to_check() -> None:
    cited = [m for p in SOURCES for m in SPEC_CLAUSE.finditer(p.read_text(encoding="utf-8"))]
    assert len(SOURCES) > 20 and len(cited) > 20


@pytest.mark.parametrize("source", SOURCES, ids=_rel)
def test_cited_docs_exist(source: Path) -> None:
    missing = sorted({m for m in DOC_PATH.findall(source.read_text(encoding="utf-8")) if not (ROOT / m).is_file()})
    assert not missing, f"{_rel(source)} cites {missing}, which are not in the repository"


@pytest.mark.parametrize("source", SOURCES, ids=_rel)
def test_cited_spec_sections_exist(source: Path) -> None:
    bad = []
    for match in SPEC_CLAUSE.finditer(source.read_text(encoding="utf-8")):
        spec = ROOT / match.group(1)
        if not spec.is_file():
            continue  # reported by test_cited_docs_exist
        headings = _headings(spec)
        bad += [f"{match.group(1)} §{n}" for n in SECTION.findall(match.group(2)) if n not in headings]
    assert not bad, f"{_rel(source)} cites sections that are no heading: {bad}"


@pytest.mark.parametrize("source", SOURCES, ids=_rel)
def test_cited_design_sections_exist(source: Path) -> None:
    cited = {_cited_name(raw) for raw in DESIGN_NAME.findall(source.read_text(encoding="utf-8"))}
    missing = sorted(cited - _design_names())
    assert not missing, f"{_rel(source)} cites {missing} in docs/design.md, which has no such section"


@pytest.mark.parametrize("source", ALL_PYTHON, ids=_rel)
def test_no_citation_outside_the_repository(source: Path) -> None:
    lines = [
        f"{n}: {line.strip()}"
        for n, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not lines, f"{_rel(source)} cites files outside the repository:\n" + "\n".join(lines)


def test_the_checks_can_fail() -> None:
    """The patterns catch what they are for (so a green run means something)."""
    assert OUTSIDE.search('see DESIGN.md "Trust"') and OUTSIDE.search("../shared/spec/policy.md")
    assert OUTSIDE.search("(spec/boundary.md §2.2)") and not OUTSIDE.search("(docs/reference/boundary.md §2.2)")
    clause = SPEC_CLAUSE.search("(docs/reference/policy.md §3.5, §99.1; docs/design.md §7)")
    assert clause is not None and SECTION.findall(clause.group(2)) == ["3.5", "99.1"]
    assert "99.1" not in _headings(ROOT / "docs/reference/policy.md")
    assert {"3.1.1", "3.17", "6"} <= _headings(ROOT / "docs/reference/policy.md")
    assert {"Events", "Settled details", "Finding the API"} <= _design_names()
    assert "No such section" not in _design_names()
    assert _cited_name("Who says what at\n# attach") == "Who says what at attach"
