"""Links between the docs resolve: every relative link in README.md and docs/*.md names a file that exists,
and a ``#anchor`` names a heading of that page (GitHub's anchors: lower case, punctuation dropped, spaces to
hyphens). docs/benchmarks.md and docs/learning_proof.md open with "What holds now", whose rows link into the
Log below; a renamed run section must not leave those links dangling."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _headings(text: str) -> list[str]:
    fence, out = False, []
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and re.match(r"#{1,6} ", line):
            out.append(line)
    return out


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors of a markdown page, duplicates numbered ``-1``, ``-2``..."""
    found: set[str] = set()
    for heading in _headings(text):
        slug = re.sub(r"^#+ ", "", heading).strip().lower().replace("`", "").replace("*", "")
        slug = re.sub(r"[^\w\- ]", "", slug).replace(" ", "-")
        unique, n = slug, 0
        while unique in found:
            n += 1
            unique = f"{slug}-{n}"
        found.add(unique)
    return found


def test_relative_links_and_anchors_resolve() -> None:
    broken = []
    for page in PAGES:
        text = page.read_text()
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
                broken.append(f"{page.relative_to(REPO)}: {target} (no heading with that anchor)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_measurement_pages_open_with_what_holds_now() -> None:
    for name in ("benchmarks.md", "learning_proof.md"):
        text = (REPO / "docs" / name).read_text()
        sections = [h for h in _headings(text) if h.startswith("## ")]
        assert sections[0] == "## What holds now", (name, sections[:2])
        assert "## Log" in sections, name
