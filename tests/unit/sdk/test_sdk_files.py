"""The SDK distribution carries every module its modules import: a helper that moves into
a module of its own (a backoff, a part of the torch integration) must be listed in
``sdk/pyproject.toml`` too, or the SDK installed alone fails at import in a training pod.

The distribution test (tests/integration/sdk/test_sdk_distribution.py) imports only the
reporter; this reads the imports of every listed file, lazy ones included, so a module
imported only by the torch integration is checked as well.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
OURS = ("dlrover_events", "schemas")
#: files of dlrover_events/sdk/ that only the full install runs
FULL_ONLY = {"bench.py"}  # `dlrover-events bench sdk`


def _listed() -> set[Path]:
    """The repository files the SDK's wheel takes (folders taken whole)."""
    data = tomllib.loads((ROOT / "sdk" / "pyproject.toml").read_text("utf-8"))
    sources = data["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    files: set[Path] = set()
    for source in sources:
        path = (ROOT / "sdk" / source).resolve()
        if path.is_dir():
            files.update(p for p in path.rglob("*.py"))
        elif path.suffix == ".py":
            files.add(path)
    return files


def _module_file(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _imported(path: Path) -> set[Path]:
    """Files of ours that ``path`` imports, and the packages on the way to them."""
    found: set[Path] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from pkg import module` names a module too
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        for name in names:
            if name.split(".")[0] not in OURS:
                continue
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                if (file := _module_file(".".join(parts[:i]))) is not None:
                    found.add(file)
    return found


def test_every_module_an_sdk_module_imports_is_in_the_sdk() -> None:
    listed = _listed()
    sdk = [p for p in listed if p.is_relative_to(ROOT / "dlrover_events")]
    assert sdk, "no dlrover_events file found in sdk/pyproject.toml's force-include"
    missing = sorted(
        f"{target.relative_to(ROOT)} (imported by {source.relative_to(ROOT)})"
        for source in sdk
        for target in _imported(source)
        if target not in listed
    )
    assert not missing, "add to sdk/pyproject.toml's force-include: " + ", ".join(missing)


def test_every_sdk_module_is_in_the_sdk() -> None:
    """dlrover_events/sdk/ is the SDK: a new file there belongs in its distribution."""
    listed = _listed()
    sdk_dir = ROOT / "dlrover_events" / "sdk"
    absent = sorted(
        str(p.relative_to(ROOT))
        for p in sdk_dir.rglob("*.py")
        if p not in listed and str(p.relative_to(sdk_dir)) not in FULL_ONLY
    )
    assert not absent, "add to sdk/pyproject.toml's force-include: " + ", ".join(absent)
