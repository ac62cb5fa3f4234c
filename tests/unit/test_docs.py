"""The documentation holds together: the README stays a newcomer's page, and every relative
link of every Markdown file of the project leads to a file that exists (a doc moved or
renamed without its links fails here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: the README is the first hour: reference goes to docs/ (issue 25); past this it has grown
README_MAX_BYTES = 12 * 1024
#: [text](target) outside code; a target with a scheme or only an anchor is not a file
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
#: a path of the repository written as code (`streams/brain/core/planner.py`); placeholders
#: (`handlers/operator/<name>/`) and globs are not paths
TOP = ("schemas", "dlrover_events", "streams", "handlers", "deploy", "tests", "examples", "sdk")
PATH = re.compile(r"`((?:" + "|".join(TOP) + r")/[^`\s<>*{}]*)`")


def _markdown_files() -> list[Path]:
    files = [REPO / "README.md", REPO / "DEVELOPMENT.md", REPO / "sdk" / "README.md"]
    files += sorted((REPO / "docs").glob("*.md"))
    files += [REPO / "deploy" / "README.md"]
    return [f for f in files if f.exists()]


def relative_links(text: str) -> list[str]:
    """The link targets of a Markdown text that name a file of the repository."""
    targets = LINK.findall(CODE.sub("", text))
    return [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:|#", t)]


def test_readme_is_at_most_12_kb() -> None:
    size = len((REPO / "README.md").read_bytes())
    assert size <= README_MAX_BYTES, (
        f"README.md is {size} bytes: reference belongs in docs/ (see its Docs table)"
    )


@pytest.mark.parametrize("doc", _markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_leads_to_a_file(doc: Path) -> None:
    broken = [t for t in relative_links(doc.read_text()) if not (doc.parent / t).exists()]
    assert not broken, f"{doc.relative_to(REPO)} links to missing files: {broken}"


@pytest.mark.parametrize("doc", _markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_path_a_doc_names_exists(doc: Path) -> None:
    """A file moved or renamed without its docs fails here (from the repository's root, or
    from the doc's folder as deploy/README.md writes them)."""
    named = {m.rstrip("/").split("::")[0] for m in PATH.findall(doc.read_text())}
    gone = sorted(p for p in named if not (REPO / p).exists() and not (doc.parent / p).exists())
    assert not gone, f"{doc.relative_to(REPO)} names paths that do not exist: {gone}"


def test_the_link_reader_finds_links_and_skips_code() -> None:
    text = "see [a](docs/a.md#x) and [b](https://x.org), `[c](nope.md)`\n```\n[d](no.md)\n```"
    assert relative_links(text) == ["docs/a.md"]


def test_every_doc_is_in_the_readme_index() -> None:
    readme = (REPO / "README.md").read_text()
    linked = {Path(t).name for t in relative_links(readme) if t.startswith("docs/")}
    missing = {f.name for f in (REPO / "docs").glob("*.md")} - linked
    assert not missing, f"docs not in README's Docs table: {sorted(missing)}"
