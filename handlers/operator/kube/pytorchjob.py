"""Kubeflow PyTorchJob (kubeflow.org/v1): the shape of its adapter, NOT implemented.

Not registered in adapter.py on purpose: an operator that claimed PyTorchJobs and then did
nothing right with them would be worse than one that says it cannot. What an
implementation has to do, method by method (see WorkloadAdapter):

- ``parse``: roles from ``spec.pytorchReplicaSpecs`` (``Master``, ``Worker``; lower-case
  them for NodeRef.type), replicas from ``.replicas``, resources from the first container
  of ``.template.spec``; bounds from ``spec.elasticPolicy.minReplicas/maxReplicas``
  (the Worker role only; Master is fixed at 1).
- ``creates_pods = False``: the training-operator creates and deletes the pods. A plan
  is applied by ``plan_change`` alone: a merge patch of
  ``spec.pytorchReplicaSpecs.Worker.replicas`` kept within elasticPolicy (reject outside),
  with the plan id in an annotation as for TrainingJobs. Migration changes the template's
  resources, which the training-operator applies only to pods it creates later: it needs
  deleting the node's pod after the patch, so the adapter would need a ``delete`` hook.
- ``parse_pod`` / ``pod_selector``: the training-operator's labels,
  ``training.kubeflow.org/job-name``, ``training.kubeflow.org/replica-type`` and
  ``training.kubeflow.org/replica-index`` (index = rank); the job uid from the pod's
  ownerReference.
- ``status_patch``: None. The status belongs to the training-operator; the plan id lives
  in the annotation only.
- RBAC: ``kubeflow.org`` ``pytorchjobs`` get/list/watch/patch in deploy/rbac/operator.yaml.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from handlers.operator.kube.adapter import WorkloadAdapter
from handlers.operator.kube.model import JobView, PodView
from handlers.operator.kube.planning import NewPod, PlanChange
from schemas.plans import ScalePlan

MESSAGE = "the PyTorchJob adapter is a skeleton: see handlers/operator/kube/pytorchjob.py"


def _missing() -> NoReturn:
    raise NotImplementedError(MESSAGE)


class PyTorchJobAdapter(WorkloadAdapter):
    kind = "PyTorchJob"
    group = "kubeflow.org"
    version = "v1"
    plural = "pytorchjobs"
    creates_pods = False

    def parse(self, obj: Mapping[str, Any]) -> JobView:
        _missing()

    def parse_pod(self, obj: Mapping[str, Any]) -> PodView | None:
        _missing()

    def pod_selector(self) -> str:
        _missing()

    def plan_change(self, job: JobView, pods: Sequence[PodView], plan: ScalePlan) -> PlanChange:
        _missing()

    def pod_manifest(
        self,
        obj: Mapping[str, Any],
        job: JobView,
        pod: NewPod,
        env: str,
        *,
        rendezvous_host: str | None = None,
    ) -> dict[str, Any]:
        raise NotImplementedError("the training-operator creates a PyTorchJob's pods")

    def status_patch(
        self,
        job: JobView,
        pods: Sequence[PodView],
        *,
        last_plan: str | None = None,
        last_plan_time: str | None = None,
    ) -> dict[str, Any] | None:
        _missing()


__all__ = ["MESSAGE", "PyTorchJobAdapter"]
