"""The Kubernetes platform on Kubeflow's PyTorchJobs keeps the platform contract: the
conformance suite (tests/contract/platform.py) over a KubeCluster with the PyTorchJob
adapter on the test kube-apiserver (the CRD of deploy/crds), a fresh namespace per check.

There is no training-operator and no kubelet: the test plays both. Its training-operator
makes a pod per Worker replica of each job (its labels, a controller reference to the
job, the replica's template), deletes the pods at or above the replicas and every pod of a
suspended job, and those of a job that is gone (the garbage collector's part); the kubelet
loop binds, starts and ends them.

What a PyTorchJob lacks it declares, and the suite checks that instead: another controller
creates its pods (``creates_pods`` False: ``create_pod`` is Invalid), and keeps its status
(``keeps_status`` False: ``set_status`` is a no-op); no node has resources of its own
(``capabilities.migrates_nodes`` False: a change that gives one some is Invalid), and the
ranks a change removes first are not kept (the training-operator removes the highest
indexes). Like TrainingJobs, its watch from version "1" expires (a CRD's objects).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

from handlers.operator.kube.client import KubeApi
from handlers.operator.kube.cluster import KubeCluster
from handlers.operator.kube.pytorchjob import (
    GROUP,
    LABEL_OPERATOR_NAME,
    LABEL_REPLICA_INDEX,
    OPERATOR_NAME,
    PLURAL,
    PYTORCH_JOB,
    VERSION,
)
from tests.contract.platform import Hosts, PlatformConformance, unique

from .kube import FakeKubelet, merge_patch
from .test_pytorchjob import operator_pod, pytorchjob
from .test_reconciler_support import KubeletLoop

pytestmark = pytest.mark.integration

#: The GPUs of the `node` fixture's Node (kube.create_node's default).
NODE_GPUS = 4
#: A Worker's resources as the suite asks for them (cpu 1, memory 1 GiB).
WORKER_RESOURCES = {"cpu": "1", "memory": "1Gi"}


def _pod(job: dict[str, Any], index: int) -> dict[str, Any]:
    """The pod the training-operator makes for Worker replica ``index`` of ``job``: its
    labels and controller reference, the replica's template."""
    replica = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    pod = operator_pod(job, index)
    spec = copy.deepcopy((replica.get("template") or {}).get("spec") or {})
    pod["spec"] = {**spec, "restartPolicy": replica.get("restartPolicy", "Never")}
    return pod


@dataclass
class TrainingOperatorLoop:
    """Plays the training-operator for the Worker replicas of every PyTorchJob of a
    namespace, and the garbage collector for the pods of jobs that are gone."""

    api: client.ApiClient
    namespace: str
    _task: asyncio.Task[None] | None = field(default=None, init=False)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            await self._once()
            await asyncio.sleep(0.1)

    async def _once(self) -> None:
        custom = client.CustomObjectsApi(self.api)
        core = client.CoreV1Api(self.api)
        listed = await custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)
        jobs = listed["items"]
        pods = (
            await core.list_namespaced_pod(
                self.namespace, label_selector=f"{LABEL_OPERATOR_NAME}={OPERATOR_NAME}"
            )
        ).items
        by_uid = {job["metadata"]["uid"]: job for job in jobs}
        made = {p.metadata.name for p in pods}
        for pod in pods:
            owner = next((r.uid for r in pod.metadata.owner_references or []), None)
            job = by_uid.get(owner or "")
            if job is None or pod.metadata.deletion_timestamp is not None:
                if job is None and pod.metadata.deletion_timestamp is None:
                    await self._delete(core, pod.metadata.name)
                continue
            index = int(pod.metadata.labels.get(LABEL_REPLICA_INDEX, "0"))
            if index >= self._wanted(job):
                await self._delete(core, pod.metadata.name)
        for job in jobs:
            if job["metadata"].get("deletionTimestamp"):
                continue
            for index in range(self._wanted(job)):
                pod = _pod(job, index)
                if pod["metadata"]["name"] not in made:
                    with contextlib.suppress(ApiException):  # made meanwhile, or refused
                        await core.create_namespaced_pod(self.namespace, pod)

    @staticmethod
    def _wanted(job: dict[str, Any]) -> int:
        spec = job.get("spec") or {}
        if (spec.get("runPolicy") or {}).get("suspend"):
            return 0
        return int(((spec.get("pytorchReplicaSpecs") or {}).get("Worker") or {}).get("replicas", 1))

    async def _delete(self, core: client.CoreV1Api, name: str) -> None:
        with contextlib.suppress(ApiException):  # gone meanwhile
            await core.delete_namespaced_pod(name, self.namespace)


class TestPyTorchJobPlatform(PlatformConformance):
    #: As for TrainingJobs: the test API server lets version 1 of a CRD's objects go.
    expires = frozenset({"jobs"})
    #: The training-operator writes a PyTorchJob's status (its conditions).
    keeps_status = False

    @pytest.fixture
    async def platform(
        self, api: client.ApiClient, pytorchjob_crd: str, namespace: str, kubelet: FakeKubelet
    ) -> AsyncIterator[KubeCluster]:
        kubelet_loop = KubeletLoop(kubelet, namespace)
        training_operator = TrainingOperatorLoop(api, namespace)
        await kubelet_loop.start()
        await training_operator.start()
        try:
            yield KubeCluster(
                KubeApi(api, PYTORCH_JOB, namespace),
                node_selector=f"kubernetes.io/hostname={kubelet.node}",
            )
        finally:
            await training_operator.stop()
            await kubelet_loop.stop()

    @pytest.fixture
    def hosts(self, api: client.ApiClient, node: str) -> Hosts:
        async def cordon() -> str:
            core = client.CoreV1Api(api)
            await merge_patch(core.patch_node, node, body={"spec": {"unschedulable": True}})
            return node

        return Hosts({node: NODE_GPUS}, cordon)

    def document(self, name: str, replicas: int = 2, **spec: Any) -> dict[str, Any]:
        """An elastic PyTorchJob of Worker replicas between 1 and 4, each asking for
        cpu 1 and memory 1 GiB; ``suspend`` is its ``runPolicy.suspend``."""
        suspend = spec.pop("suspend", None)
        assert not spec, f"a PyTorchJob of the suite takes no {sorted(spec)}"
        document = pytorchjob(name, replicas=replicas, low=1, high=4)
        worker = document["spec"]["pytorchReplicaSpecs"]["Worker"]
        (container,) = worker["template"]["spec"]["containers"]
        container["resources"] = {"requests": WORKER_RESOURCES, "limits": WORKER_RESOURCES}
        worker["template"]["spec"]["terminationGracePeriodSeconds"] = 5
        if suspend is not None:
            document["spec"]["runPolicy"] = {"suspend": suspend}
        return document

    def broken_document(self, breaks: str) -> dict[str, Any]:
        """The PyTorchJob's forms of the suite's breakages: elasticPolicy's minReplicas
        over its maxReplicas, no replica specs, a name that is no DNS label."""
        if breaks == "min-over-max":
            return pytorchjob(unique("bad"), replicas=2, low=3, high=1)
        document = self.document(unique("bad"))
        if breaks == "no-roles":
            document["spec"]["pytorchReplicaSpecs"] = {}
        else:
            document["metadata"]["name"] = f"Not_A_Label_{uuid.uuid4().hex[:6]}"
        return document
