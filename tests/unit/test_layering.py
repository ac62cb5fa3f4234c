"""The layering rule, checked on every module so it cannot erode.

schemas <- dlrover_events <- streams, handlers: a package imports only the layers to its
left. streams and handlers meet only on topics. Within handlers, the services (gateway,
console, operator) do not import one another; the simulator is the virtual operator's
pure core, which only the operator uses.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "dlrover_events", "streams", "handlers")
#: what each top-level package may import of the project (itself aside)
ALLOWED: dict[str, set[str]] = {
    "schemas": set(),
    "dlrover_events": {"schemas"},
    "streams": {"schemas", "dlrover_events"},
    "handlers": {"schemas", "dlrover_events"},
}
#: handlers' sub-packages each may import (besides itself)
HANDLERS_ALLOWED: dict[str, set[str]] = {
    "gateway": set(),
    "console": set(),
    "operator": {"simulator"},
    "simulator": set(),
}


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every absolute module an import statement names, with its line (TYPE_CHECKING and
    function-level imports too: a lazy import crosses a layer all the same)."""
    tree = ast.parse(path.read_text("utf-8"), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def _violations(root: Path = ROOT) -> list[str]:
    bad: list[str] = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root)
            sub = rel.parts[1] if package == "handlers" and len(rel.parts) > 2 else None
            for line, module in _imports(path):
                top = module.split(".")[0]
                if top not in PACKAGES or top == package:
                    if top == "handlers" == package and sub is not None:
                        target = module.split(".")[1] if "." in module else ""
                        if target != sub and target not in HANDLERS_ALLOWED.get(sub, set()):
                            bad.append(f"{rel}:{line} imports {module}")
                    continue
                if top not in ALLOWED[package]:
                    bad.append(f"{rel}:{line} imports {module}")
    return bad


def test_imports_point_one_way() -> None:
    assert _violations() == []


@pytest.mark.parametrize(
    ("source", "module"),
    [
        ("schemas/x.py", "dlrover_events.bus"),
        ("dlrover_events/x.py", "streams.brain.runtime.app"),
        ("streams/x.py", "handlers.gateway.app"),
        ("handlers/console/x.py", "handlers.gateway.runtime"),
    ],
)
def test_the_check_finds_a_crossing(tmp_path: Path, source: str, module: str) -> None:
    """The rule above would see each kind of crossing (a check that finds nothing proves
    nothing)."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    target = tmp_path / source
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"import {module}\n", "utf-8")
    assert _violations(tmp_path) == [f"{source}:1 imports {module}"]
