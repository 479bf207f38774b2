"""Every link in the README and the docs leads somewhere: a relative link names a file of the
repository, and an anchor names a heading of its page (GitHub's slugs). The README moved its
figures and design notes to docs/ and links to them; a link that breaks loses them."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

PAGES = sorted([ROOT / "README.md", ROOT / "tasks" / "README.md", ROOT / "datasets" / "README.md",
                *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
README_LIMIT = 12_000  # characters: a front door, details in docs/
# A file of ours named in the text (`evaluator/analysis/coverage.py`): modules move, and a page
# that names the old place sends its reader nowhere. Placeholders (`tasks/<name>/task.py`) and
# globs are not names.
NAMED_FILE = re.compile(r"\b((?:evaluator|data_gen|tasks|training|suites|cli|chat|benchmarks|tests|configs|\.ci)/"
                        r"[\w/.\-]*\w\.(?:py|md|yaml))\b(?![<*])")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M)}


def links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [m.group(1) or m.group(2) for m in LINK.finditer(text)]


def broken(page: Path) -> list[str]:
    out = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            out.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{target}: no such heading in {dest.name}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_link_leads_somewhere(page):
    assert not broken(page), "\n".join(broken(page))


def test_every_file_the_docs_name_exists():
    missing = [f"{page.relative_to(ROOT)}: {m.group(1)}" for page in PAGES
               for m in NAMED_FILE.finditer(page.read_text()) if not (ROOT / m.group(1)).exists()]
    assert not missing, "\n".join(missing)


def test_the_check_fails_on_a_broken_link(tmp_path):
    (tmp_path / "there.md").write_text("# There\n\n## A `code` section, too\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#a-code-section-too) [gone](missing.md) [off](there.md#nowhere) "
                    "[web](https://x.org) [self](#nowhere-here)\n```\n[in a fence](fenced.md)\n```\n")
    assert broken(page) == ["missing.md: no such file", "there.md#nowhere: no such heading in there.md",
                            "#nowhere-here: no such heading in page.md"]


def test_the_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text) <= README_LIMIT, f"README.md is {len(text)} characters; details belong in docs/"
    first_block = text.index("```bash")
    assert text.index("# set up and run the main job") > first_block
    assert text.index("## ") > first_block, "the two commands come before any section"
    for doc in (ROOT / "docs").glob("*.md"):
        assert f"docs/{doc.name}" in text, f"README.md does not link docs/{doc.name}"
