"""The layering rule, checked on every module so it cannot erode.

schemas <- dlrover_events <- streams, handlers: a package imports only the layers to its
left. streams and handlers meet only on topics. Within handlers, the services (gateway,
console, operator) do not import one another; the simulator is the virtual operator's
pure core, which only the operator uses; the console acts on jobs through the operator's
job actions (the module the `job` commands and the jobs API share), nothing else of it.

The operator is in wings (handlers/operator/): the platform contract (`platform/`: the port,
its bodies, errors, fencing and registry), the job document every platform reads
(`document/`), the platform-neutral reconciler (`reconcile/`), the doors (`doors/`: the `job`
commands, the jobs API and their actions), the virtual operator (`virtual/`), the wiring
(`wiring/`) and the platforms (`kube/`, `local/`). Each wing may reach only what
OPERATOR_WINGS allows it, directly or through what it imports: the contract and the
document reach no other wing; the reconciler reaches no platform and no door; the doors
reach no platform's modules nor a Kubernetes client (they open a platform through the
registry, by name), and may use the reconciler's pure rules; the local platform reaches no
Kubernetes (its runner serves the jobs API, a door).

The brain's core (`streams/brain/core/`) decides and does no I/O: nothing it imports, nor
anything that imports in turn, may reach a broker, database, HTTP or Kubernetes client,
a process or socket, or the brain's runtime wing (streams/brain/__init__.py).

The searcher's core (`streams/searcher/core/`) decides the same way: nothing it imports, nor
anything that imports in turn, may reach I/O or the searcher's runtime wing, its CLI or its
recorder.

The operator's reconciler is platform-neutral (`handlers/operator/reconcile/`, with the port
it drives and the job document every platform reads), and the local platform runs where no
cluster is: neither may reach a Kubernetes client, nor the Kubernetes platform's modules
(handlers/operator/kube, dlrover_events/kube), directly or through what they import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "dlrover_events", "streams", "handlers")
#: the trees the packages lie in: the repository's root, and the SDK's folder (schemas,
#: and the SDK's part of the namespace package dlrover_events)
TREES = (Path("."), Path("sdk"))
#: what each top-level package may import of the project (itself aside)
ALLOWED: dict[str, set[str]] = {
    "schemas": set(),
    "dlrover_events": {"schemas"},
    "streams": {"schemas", "dlrover_events"},
    "handlers": {"schemas", "dlrover_events"},
}
#: handlers' sub-packages each may import (besides itself): a sub-package, or one module
HANDLERS_ALLOWED: dict[str, set[str]] = {
    "gateway": set(),
    "console": {"operator.doors.actions", "operator.doors.jobs"},
    "operator": {"simulator", "experiments"},
    "simulator": set(),
}


#: Modules the brain's core must not reach, directly or through what it imports.
IO_MODULES = frozenset(
    {
        "aiokafka",
        "kafka",
        "faust",
        "mode",
        "asyncpg",
        "aiohttp",
        "kubernetes_asyncio",
        "kubernetes",
        "typer",
        "click",
        "asyncio",
        "socket",
        "ssl",
        "subprocess",
        "multiprocessing",
        "http",
        "urllib",
    }
)
CORE = Path("streams/brain/core")
#: project packages the core must not reach (the I/O wing and the benches)
CORE_FORBIDDEN = ("streams.brain.runtime", "streams.brain.bench")
SEARCHER_CORE = Path("streams/searcher/core")
#: what the searcher's core must not reach: its I/O wing and what stands on it
SEARCHER_CORE_FORBIDDEN = (
    "streams.searcher.runtime",
    "streams.searcher.cli",
    "streams.searcher.recorder",
)

KUBERNETES_CLIENTS = frozenset({"kubernetes_asyncio", "kubernetes"})
#: the Kubernetes platform, and the cluster plumbing it shares with the gateway
KUBERNETES_PLATFORM = ("handlers.operator.kube", "dlrover_events.kube")
_OP = "handlers.operator"
PLATFORMS_MODULES = (f"{_OP}.kube", f"{_OP}.local", f"{_OP}.hosts", "dlrover_events.kube")
#: operator wing -> the project modules it must not reach (directly or transitively); none
#: of them may reach a Kubernetes client either.
OPERATOR_WINGS: dict[str, tuple[str, ...]] = {
    "handlers/operator/platform": (
        *PLATFORMS_MODULES,
        f"{_OP}.reconcile",
        f"{_OP}.doors",
        f"{_OP}.virtual",
        f"{_OP}.wiring",
    ),
    "handlers/operator/document": (
        *PLATFORMS_MODULES,
        f"{_OP}.reconcile",
        f"{_OP}.doors",
        f"{_OP}.virtual",
        f"{_OP}.wiring",
    ),
    "handlers/operator/reconcile": (
        *PLATFORMS_MODULES,
        f"{_OP}.doors",
        f"{_OP}.virtual",
        f"{_OP}.wiring",
    ),
    "handlers/operator/doors": (*PLATFORMS_MODULES, f"{_OP}.virtual", f"{_OP}.wiring"),
    "handlers/operator/local": (*KUBERNETES_PLATFORM, f"{_OP}.virtual", f"{_OP}.wiring"),
    "handlers/operator/hosts": (*KUBERNETES_PLATFORM, f"{_OP}.virtual", f"{_OP}.wiring"),
    # a plain host's agent: the light install (no Kubernetes client, no simulator), and it
    # meets the operator only on topics
    "handlers/agent": (*KUBERNETES_PLATFORM, "handlers.operator", "handlers.simulator"),
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
        for path in sorted(p for tree in TREES for p in (root / tree / package).rglob("*.py")):
            rel = _in_tree(root, path)
            sub = rel.parts[1] if package == "handlers" and len(rel.parts) > 2 else None
            for line, module in _imports(path):
                top = module.split(".")[0]
                if top not in PACKAGES or top == package:
                    if top == "handlers" == package and sub is not None:
                        target = module.split(".")[1] if "." in module else ""
                        allowed = HANDLERS_ALLOWED.get(sub, set())
                        inside = module.removeprefix("handlers.")
                        if target != sub and not any(
                            inside == a or inside.startswith(a + ".") for a in allowed
                        ):
                            bad.append(f"{rel}:{line} imports {module}")
                    continue
                if top not in ALLOWED[package]:
                    bad.append(f"{rel}:{line} imports {module}")
    return bad


def _in_tree(root: Path, path: Path) -> Path:
    """``path`` from the root of its tree: what its module name is spelled from."""
    sdk = root / TREES[1]
    return path.relative_to(sdk if path.is_relative_to(sdk) else root)


def _module_file(root: Path, module: str) -> Path | None:
    """The file of a project module (`a.b` -> a/b.py or a/b/__init__.py), if there is one."""
    for tree in TREES:
        base = (root / tree).joinpath(*module.split("."))
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path
    return None


def _loaded(root: Path, path: Path) -> list[tuple[int, str]]:
    """The modules importing `path` runs, with their line: the named module, each package
    above it (its __init__ runs first), and a submodule named in `from package import x`.
    Relative imports are resolved against the file's package."""
    tree = ast.parse(path.read_text("utf-8"), str(path))
    package = list(_in_tree(root, path).parts[:-1])
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        named: list[str] = []
        if isinstance(node, ast.Import):
            named = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            named = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        for name in named:
            parts = name.split(".")
            for depth in range(1, len(parts) + 1):
                found.append((node.lineno, ".".join(parts[:depth])))
    return found


def _io_reached(
    root: Path,
    module: str,
    cache: dict[Path, list[tuple[int, str]]],
    io: frozenset[str] = IO_MODULES,
    forbidden: tuple[str, ...] = CORE_FORBIDDEN,
) -> str | None:
    """The first I/O or forbidden module that importing `module` reaches, as the chain
    that leads there (`dlrover_events.bus -> aiokafka`); None if it reaches none."""
    seen = {module}
    queue: list[tuple[str, str]] = [(module, module)]
    while queue:
        current, chain = queue.pop(0)
        if current.split(".")[0] in io:
            return chain
        if current in forbidden or current.startswith(tuple(f"{m}." for m in forbidden)):
            return chain
        if current.split(".")[0] not in PACKAGES:
            continue  # the standard library or a third-party package that is not I/O
        path = _module_file(root, current)
        if path is None:
            continue  # a name imported from a module, not a module
        if path not in cache:
            cache[path] = _loaded(root, path)
        for _, name in cache[path]:
            if name not in seen:
                seen.add(name)
                queue.append((name, f"{chain} -> {name}"))
    return None


def _core_violations(
    root: Path = ROOT,
    parts: tuple[Path, ...] = (CORE,),
    io: frozenset[str] = IO_MODULES,
    forbidden: tuple[str, ...] = CORE_FORBIDDEN,
) -> list[str]:
    """What the modules of ``parts`` (packages or files) reach of ``io`` or
    ``forbidden``, one finding per import statement."""
    bad: list[str] = []
    cache: dict[Path, list[tuple[int, str]]] = {}
    files = {
        p for part in parts for p in ([root / part] if part.suffix else (root / part).rglob("*.py"))
    }
    for path in sorted(p for p in files if p.is_file()):
        rel = path.relative_to(root)
        lines: set[int] = set()
        for line, module in _loaded(root, path):
            if line in lines:
                continue  # one finding per import statement: the first module it reaches
            reached = _io_reached(root, module, cache, io, forbidden)
            if reached is not None:
                lines.add(line)
                bad.append(f"{rel}:{line} imports {reached}")
    return bad


def test_imports_point_one_way() -> None:
    assert _violations() == []


def test_the_brains_core_reaches_no_io() -> None:
    assert _core_violations() == []


def test_the_searchers_core_reaches_no_io() -> None:
    found = _core_violations(ROOT, (SEARCHER_CORE,), IO_MODULES, SEARCHER_CORE_FORBIDDEN)
    assert found == []


def test_the_searcher_core_check_finds_its_runtime(tmp_path: Path) -> None:
    """(a check that finds nothing proves nothing)"""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    core = tmp_path / SEARCHER_CORE
    core.mkdir(parents=True)
    (core / "x.py").write_text("import math\nfrom streams.searcher.runtime import app\n")
    found = _core_violations(tmp_path, (SEARCHER_CORE,), IO_MODULES, SEARCHER_CORE_FORBIDDEN)
    assert found == [f"{SEARCHER_CORE / 'x.py'}:2 imports streams.searcher.runtime"]


def _operator_violations(root: Path = ROOT) -> list[str]:
    bad: list[str] = []
    for wing, forbidden in OPERATOR_WINGS.items():
        bad += _core_violations(root, (Path(wing),), KUBERNETES_CLIENTS, forbidden)
    return bad


def test_each_operator_wing_reaches_only_what_it_may() -> None:
    assert _operator_violations() == []


@pytest.mark.parametrize(
    ("source", "module"),
    [
        ("schemas/x.py", "dlrover_events.bus"),
        ("dlrover_events/x.py", "streams.brain.runtime.app"),
        ("streams/x.py", "handlers.gateway.app"),
        ("handlers/console/x.py", "handlers.gateway.runtime"),
        ("handlers/console/x.py", "handlers.operator.kube.client"),
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


@pytest.mark.parametrize(
    ("module", "chain"),
    [
        ("aiokafka", "aiokafka"),
        ("asyncio", "asyncio"),
        ("streams.brain.runtime.app", "streams.brain.runtime"),
        ("dlrover_events.x", "dlrover_events.x -> asyncpg"),
    ],
)
def test_the_core_check_finds_io(tmp_path: Path, module: str, chain: str) -> None:
    """The core's rule would see I/O imported directly, through a project module, and the
    runtime wing (a check that finds nothing proves nothing)."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "dlrover_events" / "x.py").write_text("import asyncpg\n", "utf-8")
    core = tmp_path / CORE
    core.mkdir(parents=True)
    (core / "ok.py").write_text("import math\nfrom schemas import y\n", "utf-8")
    (core / "x.py").write_text(f"import {module}\n", "utf-8")
    assert _core_violations(tmp_path) == [f"{CORE / 'x.py'}:1 imports {chain}"]


@pytest.mark.parametrize(
    ("source", "module", "chain"),
    [
        ("handlers/operator/reconcile/x.py", "kubernetes_asyncio.client", "kubernetes_asyncio"),
        ("handlers/operator/local/x.py", "handlers.operator.kube.client", "handlers.operator.kube"),
        ("handlers/operator/platform/api.py", "dlrover_events.kube.api", "dlrover_events.kube"),
        ("handlers/operator/reconcile/x.py", "dlrover_events.x", "dlrover_events.x -> kubernetes"),
        ("handlers/operator/reconcile/x.py", "handlers.operator.local.cluster", _OP + ".local"),
        ("handlers/operator/doors/x.py", "handlers.operator.kube.client", _OP + ".kube"),
        ("handlers/operator/platform/x.py", "handlers.operator.reconcile.y", _OP + ".reconcile"),
        ("handlers/operator/document/x.py", "handlers.operator.doors.y", _OP + ".doors"),
    ],
)
def test_the_operator_check_finds_kubernetes(
    tmp_path: Path, source: str, module: str, chain: str
) -> None:
    """The operator's rule would see a Kubernetes client or the Kubernetes platform,
    imported directly or through a project module (a check that finds nothing proves
    nothing)."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "dlrover_events" / "x.py").write_text("import kubernetes\n", "utf-8")
    target = tmp_path / source
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"import math\nimport {module}\n", "utf-8")
    assert _operator_violations(tmp_path) == [f"{source}:2 imports {chain}"]


#: Each extension point's contract module, and what it must not import: the
#: implementations beside it and the registry that names them (they import the contract,
#: never the other way: a contract that imported them would be their cycle, and no
#: implementation could be written against it alone).
CONTRACTS: dict[str, tuple[str, ...]] = {
    "streams/brain/core/optimizers/api.py": (
        "streams.brain.core.optimizers",
        "streams.brain.core.optimizers.dlrover",
        "streams.brain.core.optimizers.gpu",
    ),
    "streams/evaluators/api.py": ("streams.evaluators.registry", "streams.evaluators.kpis"),
    "streams/brain/core/schedulers/api.py": (
        "streams.brain.core.schedulers.registry",
        "streams.brain.core.schedulers.goodput_cluster",
        "streams.brain.core.schedulers.tiresias",
    ),
    "dlrover_events/domain/workloads.py": ("handlers",),
    "streams/searcher/core/api.py": (
        "streams.searcher.core.registry",
        "streams.searcher.core.state",
        "streams.searcher.core.grid",
        "streams.searcher.core.random",
        "streams.searcher.core.asha",
    ),
    "handlers/operator/platform/api.py": (
        "handlers.operator.platform.registry",
        "handlers.operator.platform.fencing",
        "handlers.operator.kube",
        "handlers.operator.local",
    ),
}


def _contract_violations(root: Path = ROOT) -> list[str]:
    """One finding per import statement: the most specific forbidden module it loads."""
    bad: list[str] = []
    for rel, forbidden in CONTRACTS.items():
        found: dict[int, str] = {}
        for line, module in _loaded(root, root / rel):
            for name in forbidden:
                if (module == name or module.startswith(f"{name}.")) and len(name) > len(
                    found.get(line, "")
                ):
                    found[line] = name
        bad += [f"{rel}:{line} imports {name}" for line, name in sorted(found.items())]
    return bad


def test_a_contract_imports_no_implementation_of_it() -> None:
    assert _contract_violations() == []


def test_the_contract_check_finds_an_implementation(tmp_path: Path) -> None:
    """(a check that finds nothing proves nothing)"""
    for rel in CONTRACTS:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("import math\n", "utf-8")
    api = "streams/brain/core/optimizers/api.py"
    (tmp_path / api).write_text("from streams.brain.core.optimizers.gpu import goodput\n")
    assert _contract_violations(tmp_path) == [f"{api}:1 imports streams.brain.core.optimizers.gpu"]
