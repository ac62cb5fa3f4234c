"""The Kubernetes platform keeps the platform contract: the conformance suite
(tests/contract/platform.py) over a KubeCluster of TrainingJobs on the test kube-apiserver,
a fresh namespace per check, its kubelet played by the test (KubeletLoop: binds and starts
every pod, confirms every deletion), its capacity the check's own fake Node (selected by
its hostname label among the session's Nodes), cordoned to show a host change.

Its watches resume from a version; a stale write is a 409; the status is the operator's
to write. It declares which watches expire version "1" on the test API server (the
TrainingJobs' only: see ``expires``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client

from handlers.operator.kube.client import KubeApi
from handlers.operator.kube.cluster import KubeCluster
from handlers.operator.kube.trainingjob import TRAINING_JOB
from tests.contract.platform import Hosts, PlatformConformance

from .kube import FakeKubelet, merge_patch
from .test_reconciler_support import KubeletLoop

#: The GPUs of the `node` fixture's Node (kube.create_node's default).
NODE_GPUS = 4


class TestKubePlatform(PlatformConformance):
    #: Of the test API server's watches, only the TrainingJobs' lets version 1 go: its
    #: cache of a CRD's objects starts when the CRD is made, while those of Pods and
    #: Nodes start at its own first version, and a test's few events never push it on.
    #: A watch of those from version 1 shows everything since instead (checked).
    expires = frozenset({"jobs"})

    @pytest.fixture
    async def platform(
        self, api: client.ApiClient, trainingjob_crd: str, namespace: str, kubelet: FakeKubelet
    ) -> AsyncIterator[KubeCluster]:
        loop = KubeletLoop(kubelet, namespace)
        await loop.start()
        try:
            yield KubeCluster(
                KubeApi(api, TRAINING_JOB, namespace),
                node_selector=f"kubernetes.io/hostname={kubelet.node}",
            )
        finally:
            await loop.stop()

    @pytest.fixture
    def hosts(self, api: client.ApiClient, node: str) -> Hosts:
        async def cordon() -> str:
            core = client.CoreV1Api(api)
            await merge_patch(core.patch_node, node, body={"spec": {"unschedulable": True}})
            return node

        return Hosts({node: NODE_GPUS}, cordon)
