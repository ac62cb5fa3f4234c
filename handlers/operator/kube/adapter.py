"""Workload adapters: one kind of training job on Kubernetes, as the platform port sees it.

The reconciler (watches, plans, results, events) is the same for every workload and
every platform; what differs on Kubernetes is which custom resource the job is, where it
keeps its replicas and resources, who creates its pods, and how they are labelled. An
adapter reads the kind's objects into the port's typed views and writes the port's
changes back as that kind's merge patches (``KubeCluster`` calls it). This module is the
contract; the kinds the operator can run are listed in kube/adapters.py (the registry):
written out, not discovered, so that what a deployment can touch (and so what its RBAC
must allow) is visible in one place, and no adapter registers by being imported.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from handlers.operator.document import trainingjob
from handlers.operator.kube.pods import LABEL_JOB
from handlers.operator.kube.wiring import PodWiring
from handlers.operator.platform.bodies import (
    JobSpecChange,
    JobView,
    NewPod,
    OperatorJobStatus,
    PlanChange,
    PlatformCapabilities,
    PodView,
)
from handlers.operator.reconcile import planning
from handlers.operator.reconcile.launch import C10D
from schemas.plans import NotApplied, ScalePlan


class WorkloadAdapter(ABC):
    """One custom resource kind of training job."""

    kind: str
    group: str
    version: str
    plural: str
    #: Whether this operator creates and deletes the job's pods (TrainingJob), or another
    #: controller does from the replicas it patches (PyTorchJob: the training-operator).
    creates_pods: bool

    @property
    def name(self) -> str:
        """The name the registry (kube/adapters.py) knows it by: its kind."""
        return self.kind

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @abstractmethod
    def parse(self, obj: Mapping[str, Any]) -> JobView:
        """The job as the pure decisions see it; InvalidJob for what they cannot use."""

    @abstractmethod
    def parse_pod(self, obj: Mapping[str, Any]) -> PodView | None:
        """One of the job's pods (None: not a pod of a job of this kind)."""

    @abstractmethod
    def pod_selector(self) -> str:
        """Label selector of the pods of every job of this kind."""

    def job_pod_selector(self, name: str) -> str:
        """Label selector of one job's pods: another controller labels them its own way."""
        return f"{self.pod_selector()},{LABEL_JOB}={name}"

    def outcome(self, job: JobView, pods: Sequence[PodView]) -> tuple[str | None, str]:
        """(Succeeded | Failed | None, reason): whether the job ended. From its pods by
        default, by this operator's rules; a workload whose own controller decides when
        its job ended (PyTorchJob) says it from the job's status instead."""
        return planning.outcome(job, pods)

    @property
    def capabilities(self) -> PlatformCapabilities:
        """What a job of this kind can be asked for on a cluster (the platform's
        declaration, ``Platform.capabilities``): by default a TrainingJob's rules, its
        suspend field honoured."""
        return PlatformCapabilities(suspend=True)

    def plan_not_applied(self, plan: ScalePlan) -> tuple[NotApplied, ...]:
        """The parts of ``plan`` no change of a job of this kind applies: a function of
        the plan alone, so a plan finished after a restart is answered the same way."""
        return trainingjob.plan_not_applied(plan)

    def configured(
        self,
        *,
        gpu_type_label: str | None,
        wiring: PodWiring | None = None,
        rendezvous_backend: str = C10D,
    ) -> WorkloadAdapter:
        """This adapter for a cluster whose nodes name their GPU type with
        ``gpu_type_label`` (None: none does), whose pods are told where the bus and the
        gateway are by ``wiring``, and whose elastic pods' agents rendezvous with
        ``rendezvous_backend``; a workload that neither selects GPU types nor makes pods
        (PyTorchJob: its template carries the variables and its rendezvous, see
        deploy/README.md) is the same adapter."""
        return self

    def pod_annotations(self, job: JobView) -> dict[str, str]:
        """Annotations every pod of the job should carry as the job is now (the
        operator patches those that differ): none by default."""
        return {}

    def services(self, job: JobView, *, rendezvous_host: str | None = None) -> list[dict[str, Any]]:
        """The Services the job's pods need, made before them and deleted with the job
        (only called when ``creates_pods``): none, unless its pods rendezvous at one
        (``rendezvous_host`` None: the platform has no other place for them to meet)."""
        return []

    @abstractmethod
    def plan_change(self, job: JobView, pods: Sequence[PodView], plan: ScalePlan) -> PlanChange:
        """The plan as a change of the job (PlanRejected: why a job of this kind cannot
        take it)."""

    @abstractmethod
    def job_patch(self, job: JobView, change: JobSpecChange) -> dict[str, Any]:
        """``change`` as one merge patch of the job object, on the version it was decided
        on."""

    @abstractmethod
    def status_patch(self, status: OperatorJobStatus) -> dict[str, Any] | None:
        """``status`` as a merge patch of the status subresource; None for a kind whose
        status is its own controller's."""


class PodCreatingAdapter(WorkloadAdapter):
    """A kind whose pods this operator creates and deletes (TrainingJob); a kind whose pods
    another controller owns (PyTorchJob: the training-operator) has no pod manifest at all."""

    creates_pods = True

    @abstractmethod
    def pod_manifest(
        self, job: JobView, pod: NewPod, env: str, *, rendezvous_host: str | None = None
    ) -> dict[str, Any]:
        """A new pod of the job; ``rendezvous_host``: where an elastic role's pods find
        their rendezvous store (None: the platform's default, a per-job Service on a
        cluster)."""


__all__ = ["PodCreatingAdapter", "WorkloadAdapter"]
