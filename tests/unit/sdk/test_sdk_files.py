"""The SDK's folder (sdk/) holds every module its modules import: the SDK's wheel is that
folder and nothing else, so a module of the project that a file of sdk/ imports but that
lies outside it (in the full tree, ./dlrover_events/) would fail at import in a training
pod that has only the SDK. This reads the imports of every file of sdk/, lazy ones and
the torch integration's included, so a module imported only on a rarely taken path is
checked as well; tests/integration/sdk/test_sdk_distribution.py imports them installed.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SDK = ROOT / "sdk"
OURS = ("dlrover_events", "schemas", "streams", "handlers")
#: files of the SDK's folder that only the full install runs
FULL_ONLY = {SDK / "dlrover_events" / "sdk" / "bench.py"}  # `dlrover-events bench sdk`


def _module_file(root: Path, name: str) -> Path | None:
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _imported(path: Path) -> set[str]:
    """The modules of ours that ``path`` imports (``from pkg import name`` may name a
    module: both are taken, and a name that is no module is told apart later)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {n for n in found if n.split(".")[0] in OURS}


def outside_the_sdk(sdk: Path = SDK, full: Path = ROOT) -> list[str]:
    """``module (imported by file)`` for each module of the project a file of ``sdk``
    imports that is a file of the full tree ``full`` and not of ``sdk``."""
    missing = set()
    for source in sorted(sdk.rglob("*.py")):
        if source in FULL_ONLY:
            continue
        for name in _imported(source):
            if _module_file(sdk, name) is None and _module_file(full, name) is not None:
                missing.add(f"{name} (imported by {source.relative_to(sdk)})")
    return sorted(missing)


def test_every_module_an_sdk_module_imports_is_in_the_sdk() -> None:
    assert len(list(SDK.rglob("*.py"))) > 40
    missing = outside_the_sdk()
    assert not missing, "the SDK's folder (sdk/) lacks: " + ", ".join(missing)


def test_a_module_of_the_full_tree_imported_by_the_sdk_is_found(tmp_path: Path) -> None:
    """The check can fail: an SDK module importing a module of the full tree."""
    sdk, full = tmp_path / "sdk", tmp_path
    (sdk / "dlrover_events" / "sdk").mkdir(parents=True)
    (full / "dlrover_events" / "store").mkdir(parents=True)
    (full / "dlrover_events" / "store" / "__init__.py").write_text("")
    (sdk / "dlrover_events" / "sdk" / "__init__.py").write_text(
        "from dlrover_events.store import connect\nimport schemas.jobs\n"
    )
    (sdk / "schemas").mkdir()
    (sdk / "schemas" / "jobs.py").write_text("")
    assert outside_the_sdk(sdk, full) == [
        "dlrover_events.store (imported by dlrover_events/sdk/__init__.py)"
    ]
