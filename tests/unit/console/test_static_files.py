"""The console's page finds every file it names, and the wheel ships them: the console
runs without internet, so nothing it needs may come from elsewhere."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

from handlers.console.page import STATIC, index_html

ROOT = Path(__file__).resolve().parents[3]


def test_the_page_names_only_files_it_has_and_nothing_from_elsewhere() -> None:
    page = index_html("prod", ["job.metrics"])
    named = re.findall(r'(?:src|href)="([^"]+)"', page)
    local = [n for n in named if n.startswith("static/")]
    assert local, "the page names its script and styles"
    assert all(n.startswith(("static/", "data:", "#")) for n in named), named
    for name in local:
        assert (STATIC / name.removeprefix("static/")).is_file(), name
    assert 'data-home="prod"' in page


def test_the_wheel_ships_every_static_file() -> None:
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["handlers"]
    for path in STATIC.rglob("*"):
        if path.is_file():
            rel = str(path.relative_to(ROOT / "handlers"))
            assert any(
                fnmatch.fnmatch(rel, p) and rel.count("/") == p.count("/") for p in patterns
            ), f"{rel} is not in handlers' package-data"


def test_the_home_env_is_escaped() -> None:
    assert "<script>" not in index_html("<script>", [])
