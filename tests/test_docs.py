"""The documents as a new user meets them: every Python code block in README.md
and docs/*.md runs as written, example outputs written as doctests match what
the code prints, relative links point at something, and the guides stay short.

The blocks run through Sybil (a maintained runner), one test per document, in
the document's order and in one namespace per document, as a reader pasting
them into one session would, from a fresh temporary folder (some blocks save
files). A block that cannot run here is marked in the document itself, with its
reason visible: a non-python fence, or Sybil's `<!-- skip: next "reason" -->`.
Doctest outputs are compared with ELLIPSIS and NORMALIZE_WHITESPACE: `...`
stands for what depends on the host (estimated times, the cost model's name)."""
import doctest
import pathlib
import re
import unittest

import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

ROOT = pathlib.Path(__file__).resolve().parent.parent
RUN_DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
LINKED_DOCS = (RUN_DOCS + [ROOT / "benchmarks" / "RESULTS.md"]
               + sorted((ROOT / "benchmarks" / "history").glob("*.md")))
LINE_LIMITS = {"README.md": 300, "benchmarks/RESULTS.md": 400}

SYBIL = Sybil(
    parsers=[
        PythonCodeBlockParser(
            doctest_optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE),
        SkipParser(),
    ],
    path=str(ROOT),
)


def _name(path):
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def _examples(path):
    return list(SYBIL.parse(path).examples())


@pytest.mark.parametrize("path", RUN_DOCS, ids=_name)
def test_code_blocks_run_as_written(path, tmp_path, monkeypatch):
    """Each document's Python blocks, in order, in one namespace."""
    monkeypatch.chdir(tmp_path)
    for example in _examples(path):
        try:
            example.evaluate()
        except unittest.SkipTest:   # the document's own `skip: next "reason"`
            continue
        except Exception as e:      # which block, where: Sybil's own failure says it
            if isinstance(e, AssertionError):
                raise
            raise AssertionError(f"{_name(path)}, line {example.line}: "
                                 f"{type(e).__name__}: {e}") from e


def test_no_python_block_hides_under_another_name():
    """Sybil runs ```python fences only: a block fenced as py, python3 or Python would
    silently not run. Blocks that must not run say why (skip) or are not Python."""
    for path in RUN_DOCS:
        hidden = re.findall(r"^```(py|python3|Python|pycon|ipython)\s*$", path.read_text(),
                            flags=re.M)
        assert not hidden, f"{_name(path)}: fences {hidden} are not run; use ```python"


# ---- links ---------------------------------------------------------------------

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", flags=re.M | re.S)


def _slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path):
    text = FENCE.sub("", path.read_text())
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, flags=re.M)}


def _links(path):
    text = FENCE.sub("", path.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)   # inline code is not a link
    for m in LINK.finditer(text):
        yield m.group(1) or m.group(2)


@pytest.mark.parametrize("path", LINKED_DOCS, ids=_name)
def test_relative_links_point_at_something(path):
    broken = []
    for target in _links(path):
        if re.match(r"[a-z]+:", target):   # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.name})")
    assert not broken, f"{_name(path)}: " + "; ".join(broken)


def test_link_check_finds_a_broken_link(tmp_path):
    """The check itself fails on a missing file and on a missing heading."""
    (tmp_path / "a.md").write_text("# Title\n\n## Some section: here\n")
    doc = tmp_path / "b.md"
    doc.write_text("[ok](a.md#some-section-here) [gone](missing.md) [bad](a.md#nope)\n"
                   "`[code](not-a-link.md)`\n")
    assert list(_links(doc)) == ["a.md#some-section-here", "missing.md", "a.md#nope"]
    assert _anchors(tmp_path / "a.md") == {"title", "some-section-here"}
    with pytest.raises(AssertionError, match=r"missing.md \(no such file\).*#nope"):
        test_relative_links_point_at_something(doc)


# ---- length ----------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(LINE_LIMITS))
def test_guides_stay_short(name):
    """The README is a user's guide and RESULTS.md the latest numbers; details go in
    docs/ and the dated history in benchmarks/history/."""
    lines = (ROOT / name).read_text().count("\n")
    assert lines <= LINE_LIMITS[name], f"{name}: {lines} lines, at most {LINE_LIMITS[name]}"
