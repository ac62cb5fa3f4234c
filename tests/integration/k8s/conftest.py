"""A real kube-apiserver v1.20.2 + etcd on 127.0.0.1 for the operator's tests.

`kube` (session): runs `deploy/testenv/kube-testenv.sh build` (cached under
~/.cache/dlrover-events; the first build takes several minutes) and `start` into a tmp
dir, yields the admin kubeconfig path, and stops both processes at the end.

Per test: `api` (an admin ApiClient), `namespace` (a fresh one), `node` + `kubelet`
(a fake Ready node and the FakeKubelet that binds pods to it and reports their status).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client, config

from dlrover_events.settings import Settings
from tests.conftest import EnvFactory

from .kube import (
    APISERVER,
    PYTORCHJOB_CRD_FILE,
    FakeKubelet,
    apply_crd,
    create_namespace,
    create_node,
    run_script,
)
from .test_reconciler_support import Cluster, KubeletLoop

HERE = Path(__file__).resolve().parent
BUILD_TIMEOUT_S = 45 * 60  # about 6.5 min on 2 cores, apt downloads included
START_TIMEOUT_S = 120


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without a cached kube-apiserver the first test here also pays for the build, which
    is longer than the suite's per-test timeout: give that test the build's time."""
    if APISERVER.exists():
        return
    for item in items:
        if HERE in item.path.parents:
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
async def trainingjob_crd(api: client.ApiClient) -> str:
    """The TrainingJob CRD of deploy/crds, applied and Established. Returns its name."""
    crd = await apply_crd(api)
    name: str = crd["metadata"]["name"]
    return name


@pytest.fixture
async def pytorchjob_crd(api: client.ApiClient) -> str:
    """The PyTorchJob CRD of deploy/crds (kubeflow.org/v1), applied and Established: the
    training-operator's resource, without a training-operator. Returns its name."""
    crd = await apply_crd(api, PYTORCHJOB_CRD_FILE)
    name: str = crd["metadata"]["name"]
    return name


@pytest.fixture
async def namespace(api: client.ApiClient) -> str:
    """A fresh namespace. Left behind: without the controller-manager's namespace
    controller a deleted namespace would stay Terminating anyway."""
    return await create_namespace(api)


@pytest.fixture
async def node(api: client.ApiClient) -> str:
    """A fresh Node object, Ready, with no not-ready taint (there is no kubelet)."""
    return await create_node(api)


@pytest.fixture
def kubelet(api: client.ApiClient, node: str) -> FakeKubelet:
    return FakeKubelet(api, node)


@pytest.fixture
async def cluster(
    settings: Settings,
    pg_dsn: str,
    api: client.ApiClient,
    trainingjob_crd: str,
    namespace: str,
    kubelet: FakeKubelet,
) -> AsyncIterator[Cluster]:
    """Real reconcilers against this test's namespace, with a kubelet loop playing pods."""
    loop = KubeletLoop(kubelet, namespace)
    await loop.start()
    c = Cluster(settings, pg_dsn, api, namespace)
    c.kubelet_loop = loop  # type: ignore[attr-defined]
    try:
        yield c
    finally:
        for op in c.running:
            if not op.task.done():
                await op.halt()
        await loop.stop()


@pytest.fixture
async def env(make_env: EnvFactory) -> str:
    """A fresh env per test: topics and ledgers of one test never meet another's."""
    return (await make_env()).name
