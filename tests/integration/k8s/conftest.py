"""Fixtures of the operator's tests on the test control plane (tests/integration/k8s/
control_plane.py gives the suite `kube`, `api` and `namespace`: the kube-apiserver v1.20.2 +
etcd on 127.0.0.1, an admin ApiClient, a fresh namespace).

Per test: the CRDs of deploy/crds applied, `node` + `kubelet` (a fake Ready node and the
FakeKubelet that binds pods to it and reports their status), `cluster` (real reconcilers
with a kubelet loop playing pods) and a fresh `env`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client

from dlrover_events.settings import Settings
from tests.conftest import EnvFactory

from .kube import PYTORCHJOB_CRD_FILE, FakeKubelet, apply_crd, create_node
from .test_reconciler_support import Cluster, KubeletLoop


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
