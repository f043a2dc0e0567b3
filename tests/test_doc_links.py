"""Every relative link in the README and the docs lands on a file that exists (and a heading, where it names one)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]  # the checkout (tests/ is one level down)
DOCS = sorted({ROOT / "README.md", ROOT / "p4" / "README.md", *ROOT.glob("docs/**/*.md")})
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code, where brackets are not links."""
    return re.sub(r"`[^`\n]*`", "", _FENCE.sub("", text))


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a markdown file's headings."""
    return {anchor(m[1]) for m in re.finditer(r"^#{1,6} (.+)$", _FENCE.sub("", path.read_text()), re.MULTILINE)}


def test_anchor_follows_github() -> None:
    assert anchor("Where the time goes (`kvpool why`)") == "where-the-time-goes-kvpool-why"
    assert anchor("The grid (`scripts/bench_replay.py`)") == "the-grid-scriptsbench_replaypy"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in _LINK.findall(_prose(doc.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto: are not ours to check
            continue
        file_part, _, frag = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            broken.append(f"{target}: no heading #{frag}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)
