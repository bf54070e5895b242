"""The format and recovery documents in docs/ are what the repository cites:
no file refers to an outside specification by section or pitfall number, and
every ``docs/<file>.md#anchor`` reference names a heading that exists.

Runs from a source checkout or an sdist (both carry docs/); a wheel's test
run gets only tests/ and pyproject.toml (cibuildwheel), so the module skips
when there is no docs/ beside tests/.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

if not DOCS.is_dir():
    pytest.skip("no docs/ beside tests/ (a wheel's copy of the tests)", allow_module_level=True)

# what is scanned: the sources, tests, benchmarks, examples, fuzz targets, docs, CI and packaging
SCANNED = ("rmqstore", "tests", "bench", "examples", "fuzz", "docs", ".ci", ".github")
SCANNED_FILES = ("README.md", "setup.py", "pyproject.toml", "MANIFEST.in", "CHANGELOG.md", "noxfile.py", "Makefile")
TEXT_SUFFIXES = {".py", ".pyx", ".pxd", ".pxi", ".pyi", ".h", ".md", ".rst", ".txt", ".toml", ".cfg", ".ini", ".yml",
                 ".yaml", ".sh", ".json", ""}
# generated from the .pyx, or data
SKIPPED = ({"rmqstore/_core.c"}, ("tests/data/",))

# built from pieces so that neither this test nor a grep for them finds this file
_SECTION_SIGN = "\u00a7"
SECTION_CITATION = re.compile("S" + "PEC" + r"\s*(?:" + _SECTION_SIGN + r"|\d)|" + _SECTION_SIGN + r"\s*\d")
PITFALL_NUMBER = re.compile(r"(?<![\w-])" + "P" + r"-\d")
DOC_REF = re.compile(r"docs/([\w.-]+\.md)(?:#([\w-]+))?")
MD_LINK = re.compile(r"\]\(([\w.-]*\.md)?#([^)\s]+)\)")


def _files():
    out = []
    for name in SCANNED:
        base = ROOT / name
        if base.is_dir():
            out += [p for p in base.rglob("*") if p.is_file()]
    out += [ROOT / name for name in SCANNED_FILES if (ROOT / name).is_file()]
    files = []
    for p in sorted(set(out)):
        rel = p.relative_to(ROOT).as_posix()
        if rel in SKIPPED[0] or rel.startswith(SKIPPED[1]) or "__pycache__" in rel:
            continue
        if p.suffix not in TEXT_SUFFIXES:
            continue
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        files.append((rel, text))
    return files


FILES = _files()


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lowercased, punctuation other
    than '-' and '_' dropped, spaces turned into '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link: its text
    text = text.lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(doc: Path) -> set:
    """Every heading anchor of a Markdown file (fenced code skipped; repeated
    headings get GitHub's -1, -2 suffixes)."""
    seen: dict = {}
    out = set()
    fenced = False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            slug = github_slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.fixture(scope="module")
def doc_anchors() -> dict:
    return {p.name: anchors(p) for p in DOCS.glob("*.md")}


def test_slug_rules():
    assert github_slug("CommitLog record") == "commitlog-record"
    assert github_slug("Pitfall: index time resolution") == "pitfall-index-time-resolution"
    assert github_slug("SYNC_FLUSH and group commit") == "sync_flush-and-group-commit"
    assert github_slug("abort and lock") == "abort-and-lock"
    assert github_slug("Recovery, flushing and RocketMQ's pitfalls") == "recovery-flushing-and-rocketmqs-pitfalls"


def test_the_documents_exist(doc_anchors):
    assert {"format.md", "recovery.md"} <= set(doc_anchors)
    assert "commitlog-record" in doc_anchors["format.md"]
    assert "consumequeue-unit" in doc_anchors["format.md"]
    assert any(a.startswith("pitfall-") for a in doc_anchors["recovery.md"])


def test_no_outside_spec_citations():
    found = []
    for rel, text in FILES:
        for i, line in enumerate(text.splitlines(), 1):
            if SECTION_CITATION.search(line) or PITFALL_NUMBER.search(line):
                found.append(f"{rel}:{i}: {line.strip()}")
    assert not found, "cite docs/format.md or docs/recovery.md instead:\n" + "\n".join(found)


def test_every_docs_reference_resolves(doc_anchors):
    bad = []
    n = 0
    for rel, text in FILES:
        for i, line in enumerate(text.splitlines(), 1):
            refs = [(m.group(1), m.group(2)) for m in DOC_REF.finditer(line)]
            if rel.startswith("docs/"):  # links between and within the documents
                here = rel.split("/", 1)[1]
                refs += [(m.group(1) or here, m.group(2)) for m in MD_LINK.finditer(line)]
            for doc, anchor in refs:
                n += 1
                if doc not in doc_anchors:
                    bad.append(f"{rel}:{i}: no docs/{doc}")
                elif anchor is not None and anchor not in doc_anchors[doc]:
                    bad.append(f"{rel}:{i}: docs/{doc} has no heading #{anchor}")
    assert n > 100  # the code cites the documents throughout
    assert not bad, "\n".join(bad)


def test_readme_links_the_documents():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "(docs/format.md)" in readme and "(docs/recovery.md)" in readme
