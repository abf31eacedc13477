"""Every relative link of README.md and docs/*.md points to a file of the checkout, and every
``#anchor`` to a heading of the file it names, as GitHub renders them (issue 26: the operator's
page links into docs/, and docs/ into each other and back)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)


def prose(text: str) -> str:
    """The text without fenced code blocks (a ``# comment`` there is no heading)."""
    return _FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: the rendered text, lower case, punctuation dropped (letters,
    digits, ``_``, ``-`` and spaces kept), each space a ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor; a repeated one gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for _hashes, heading in _HEADING.findall(prose(text)):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(text: str) -> list[str]:
    """The targets of the inline links outside code."""
    return _LINK.findall(_INLINE_CODE.sub("", prose(text)))


def broken(page: Path, text: str | None = None) -> list[str]:
    """What is wrong with the page's relative links, one line each."""
    text = page.read_text() if text is None else text
    problems = []
    for target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
            continue  # https:, mailto:: not this test's business
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if path and not file.exists():
            problems.append(f"{target}: no {file.relative_to(REPO) if file.is_relative_to(REPO) else file}")
            continue
        if not anchor:
            continue
        if file.suffix != ".md" or file.is_dir():
            problems.append(f"{target}: an anchor into {file.name}, which is not Markdown")
        elif anchor not in anchors(text if file == page else file.read_text()):
            problems.append(f"{target}: no heading #{anchor} in {file.relative_to(REPO)}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_relative_link_resolves(page):
    assert links(page.read_text()), f"{page.name} links nowhere: is the link pattern still right?"
    assert broken(page) == []


def test_the_readme_links_to_each_page_of_docs():
    targets = {t.partition("#")[0] for t in links((REPO / "README.md").read_text())}
    pages = {f"docs/{p.name}" for p in PAGES if p.parent.name == "docs"}
    assert pages and pages <= targets, pages - targets


def test_slugs_are_githubs():
    assert slug("Admin endpoint: probes and metrics") == "admin-endpoint-probes-and-metrics"
    assert slug("Preflight: `replay-proxy check`") == "preflight-replay-proxy-check"
    assert slug("Text and prepared statements, before and after the restructure") == (
        "text-and-prepared-statements-before-and-after-the-restructure"
    )
    assert slug("Reload (SIGHUP)") == "reload-sighup"
    assert anchors("# A\n\n```sh\n# not a heading\n```\n## A\n") == {"a", "a-1"}


def test_a_broken_link_or_anchor_is_found(tmp_path):
    page = REPO / "docs" / "a-page-that-is-not-there.md"
    text = (
        "[ok](../README.md#the-two-commands) [gone](missing.md) [bad anchor](../README.md#no-such-heading)\n"
        "[self](#here) [not self](#there) `[in code](nowhere.md)`\n\n## Here\n\n```\n[in a block](nowhere.md)\n```\n"
    )
    assert broken(page, text) == [
        "missing.md: no docs/missing.md",
        "../README.md#no-such-heading: no heading #no-such-heading in README.md",
        "#there: no heading #there in docs/a-page-that-is-not-there.md",
    ]
