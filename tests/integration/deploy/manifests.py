"""The deploy/ manifests as `kubectl kustomize` renders them, for the tests of the install.

The renderer is the machine's `kubectl` (kustomize v5): the overlays use kustomize's
current fields (`resources`, `labels`, `patches`, `images`, components). Every overlay of
deploy/overlays is rendered as it is; every component of deploy/components is rendered the
way an install uses one: a kustomization of its own over the prod overlay.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped,unused-ignore]

from tests.conftest import REPO

DEPLOY = REPO / "deploy"
OVERLAYS = sorted(p.parent.name for p in (DEPLOY / "overlays").glob("*/kustomization.yaml"))
COMPONENTS = sorted(p.parent.name for p in (DEPLOY / "components").glob("*/kustomization.yaml"))
#: the overlay a component is tried on
INSTALL = "prod"
#: the variable that sets the number of each named container port, by (component, port
#: name); None: any component
PORT_VARIABLES = {
    ("gateway", "http"): "DLROVER_EVENTS_GATEWAY_PORT",
    ("console", "http"): "DLROVER_EVENTS_CONSOLE_PORT",
    (None, "metrics"): "DLROVER_EVENTS_METRICS_PORT",
}
#: the variable that sets the address each of them binds
BIND_VARIABLES = {
    "DLROVER_EVENTS_GATEWAY_PORT": "DLROVER_EVENTS_GATEWAY_HOST",
    "DLROVER_EVENTS_CONSOLE_PORT": "DLROVER_EVENTS_CONSOLE_HOST",
    "DLROVER_EVENTS_METRICS_PORT": "DLROVER_EVENTS_METRICS_HOST",
}

Doc = dict[str, Any]


@functools.cache
def kubectl() -> str:
    """`kubectl` on PATH, with a kustomize v5 or later in it."""
    found = shutil.which("kubectl")
    assert found, "kubectl (with kustomize v5) is needed to render deploy/"
    out = subprocess.run(
        [found, "version", "--client", "-o", "json"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    version = json.loads(out).get("kustomizeVersion", "")
    major = re.match(r"v(\d+)\.", version)
    assert major and int(major.group(1)) >= 5, f"kustomize {version!r} in {found}: need v5+"
    return found


def parse(text: str) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def render(directory: Path) -> list[Doc]:
    done = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"kubectl kustomize {directory}: {done.stderr}"
    return parse(done.stdout)


def overlay(name: str) -> list[Doc]:
    return render(DEPLOY / "overlays" / name)


def with_component(component: str, workdir: Path, base: str = INSTALL) -> list[Doc]:
    """`base` with `component` added, as an install adds one: a copy of the overlay whose
    kustomization lists the component (its other paths made relative to the copy, since
    kustomize takes relative paths only)."""
    source = DEPLOY / "overlays" / base
    copy = workdir / base
    shutil.copytree(source, copy)
    kustomization = yaml.safe_load((copy / "kustomization.yaml").read_text())

    def moved(entry: str) -> str:
        if (source / entry).is_dir():
            return os.path.relpath((source / entry).resolve(), copy)
        return entry  # a file of the overlay: copied beside it

    kustomization["resources"] = [moved(r) for r in kustomization.get("resources", [])]
    kustomization["components"] = [
        *(moved(c) for c in kustomization.get("components", [])),
        os.path.relpath(DEPLOY / "components" / component, copy),
    ]
    (copy / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return render(copy)


def component_of(workload: Doc) -> str:
    labels = workload["spec"]["template"]["metadata"]["labels"]
    return str(labels["app.kubernetes.io/component"])


def port_variable(workload: Doc, port_name: str) -> str:
    """The variable whose value is the number of the workload's port of that name."""
    return (
        PORT_VARIABLES.get((component_of(workload), port_name)) or PORT_VARIABLES[(None, port_name)]
    )


def of_kind(docs: list[Doc], kind: str) -> dict[str, Doc]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_spec(doc: Doc) -> Doc:
    spec: Doc = doc["spec"]["template"]["spec"]
    return spec


def workloads(docs: list[Doc]) -> Iterator[Doc]:
    """Every Deployment and Job."""
    return (d for d in docs if d["kind"] in ("Deployment", "Job"))


def service_of(docs: list[Doc], deployment: Doc) -> Doc:
    """The one Service whose selector picks the Deployment's pods."""
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    found = [
        s
        for s in docs
        if s["kind"] == "Service"
        and s["spec"]["selector"].items() <= labels.items()
    ]  # fmt: skip
    assert len(found) == 1, f"{deployment['metadata']['name']}: Services {found}"
    return found[0]
