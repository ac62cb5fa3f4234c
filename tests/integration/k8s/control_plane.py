"""The test control plane as fixtures for the whole suite (a pytest plugin, named in
tests/conftest.py): a real kube-apiserver v1.20.2 + etcd on 127.0.0.1, whichever folder a
test against it lives in (the operator's in tests/integration/k8s/, the gateway's
ConfigMaps beside the gateway's other tests).

One definition, so that a run that collects tests of several folders starts one control
plane for all of them.

`kube` (session): runs `deploy/testenv/kube-testenv.sh build` (cached under
~/.cache/dlrover-events; the first build takes several minutes) and `start` into a tmp
dir, yields the admin kubeconfig path, and stops both processes at the end.

Per test: `api` (an admin ApiClient) and `namespace` (a fresh one).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client, config

from .kube import APISERVER, create_namespace, run_script

BUILD_TIMEOUT_S = 45 * 60  # about 6.5 min on 2 cores, apt downloads included
START_TIMEOUT_S = 120


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without a cached kube-apiserver the first test on it also pays for the build, which
    is longer than the suite's per-test timeout: give that test the build's time."""
    if APISERVER.exists():
        return
    for item in items:
        if "kube" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(BUILD_TIMEOUT_S + START_TIMEOUT_S))
            return


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Path of the admin kubeconfig of a freshly started test control plane."""
    run_script("build", timeout=BUILD_TIMEOUT_S)
    workdir = tmp_path_factory.mktemp("kube-testenv")
    try:
        # The script's watchdog stops the servers should this session die without teardown.
        owner = {"KUBE_TESTENV_OWNER_PID": str(os.getpid())}
        out = run_script("start", str(workdir), timeout=START_TIMEOUT_S, env=owner)
        kubeconfig = Path(out.strip())
        assert kubeconfig == workdir / "kubeconfig", kubeconfig
        yield kubeconfig
    finally:
        run_script("stop", str(workdir), timeout=60)


@pytest.fixture
async def api(kube: Path) -> AsyncIterator[client.ApiClient]:
    """An ApiClient authenticated as the admin (system:masters)."""
    api_client = await config.new_client_from_config(config_file=str(kube))
    async with api_client:
        yield api_client


@pytest.fixture
async def namespace(api: client.ApiClient) -> str:
    """A fresh namespace. Left behind: without the controller-manager's namespace
    controller a deleted namespace would stay Terminating anyway."""
    return await create_namespace(api)
