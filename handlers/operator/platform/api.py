"""Where an env's real jobs run: the platform port, its bodies, its errors and its registry.

The one contract between the reconciler (handlers.operator.reconcile) and a platform, as
torch.distributed.elastic's rendezvous/api.py is between an agent and a rendezvous
backend. The reconciler applies ScalePlans, makes a job's pods match its desired state
and reports node and job events on any platform that answers ``Platform``: Kubernetes
(``handlers.operator.kube.cluster.KubeCluster``: the API server, and a workload adapter
per kind of job) and the local platform (``handlers.operator.local.cluster.LocalCluster``:
files and processes on this machine). The `job` commands and the jobs API use the same
port. The brain cannot tell the platforms apart: both give the same events and results.

Bodies are typed values with numbers (a node's resources in millicores, bytes and
GPUs), never a platform's own forms: no Kubernetes object, quantity string or HTTP code
crosses the port. Each platform converts at its own edge, and says a refusal with this
module's errors (``ObjectNotFound``, ``Conflict``, ``Invalid``; ``Expired`` for a watch
that lost events, ``Unavailable`` for a platform that cannot answer now).

A job's *pods* are its nodes (the brain's NodeRef: role and rank) as the platform runs
them: a Kubernetes Pod, or a process tree under a shim on the local platform.

For a cluster scheduler (issue 26): a job's suspend state (``JobView.suspended``, written
by ``JobSpecChange.suspend`` on a platform whose ``capabilities.suspend`` is true: TrainingJob
``spec.suspend``, PyTorchJob ``spec.runPolicy.suspend``, the field Kueue uses), who admitted
or suspended it and why (``JobAdmission``, kept on the job in the same write as the
suspend), and the cluster's capacity (``Host``s and their allocatable GPUs, schedulable or
not: a Kubernetes cluster's Nodes, the local platform's slots), listed and watched from a
``CapacitySource``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal, Protocol

from handlers.operator.platform.bodies import (
    Bookmark,
    Host,
    JobSpecChange,
    JobView,
    NewPod,
    OperatorJobStatus,
    PlanChange,
    PlatformCapabilities,
    PodView,
    UnreadableJob,
)
from schemas.plans import NotApplied, ScalePlan

#: What a platform's watch follows.
WatchKind = Literal["jobs", "pods"]
#: A job as a platform lists it: readable, or not (and why).
JobEntry = JobView | UnreadableJob
#: What a watch yields: ADDED, MODIFIED or DELETED with the object, BOOKMARK with a Bookmark.
WatchEvent = tuple[str, JobEntry | PodView | Bookmark]


class Platform(Protocol):
    """The calls the reconciler and the `job` commands make of a platform.

    Writes name what they change by the version they read (a job) or by decided names (a
    pod), so that a repeated call is the same call: a create of a pod that exists answers
    False, a delete of what is gone False. A refusal is one of this module's errors.
    """

    #: the platform as results name it ("Kubernetes", "local")
    name: str
    namespace: str
    #: whether the reconciler creates and deletes the jobs' pods (False: another
    #: controller does, from the replicas a change sets: a PyTorchJob's training-operator)
    creates_pods: bool

    @property
    def capabilities(self) -> PlatformCapabilities:
        """What its jobs can be asked for (GPU types, spares, suspend, which nodes can be
        replaced): what ``plan_change`` holds a plan to, and what the operator publishes
        with the cluster's capacity so the brain plans only what can be applied."""
        ...

    # -- jobs -----------------------------------------------------------------------------

    async def list_jobs(self) -> tuple[list[JobEntry], str]:
        """Every job, and the version a watch of jobs goes on from."""

    async def get_job(self, name: str) -> JobEntry | None: ...

    async def submit_job(self, document: Mapping[str, Any]) -> JobView:
        """A new job from its document (a TrainingJob, as `job submit` reads it);
        Conflict when the name is taken, Invalid when the platform refuses it."""

    async def change_job(self, job: JobView, change: JobSpecChange) -> JobView:
        """The job after ``change``; Conflict when it changed since ``job`` was read,
        ObjectNotFound when it is gone."""

    async def set_status(self, job: JobView, status: OperatorJobStatus) -> None:
        """Say ``status`` on the job (a no-op where its own controller keeps it);
        ObjectNotFound when it is gone."""

    async def delete_job(self, name: str) -> bool: ...

    # -- pods -----------------------------------------------------------------------------

    async def list_pods(self, job: str | None = None) -> tuple[list[PodView], str]:
        """The pods of one job (None: of every job), and the version a watch goes on
        from."""

    async def create_pod(self, job: JobView, pod: NewPod, env: str) -> bool:
        """Start ``pod`` of ``job`` (its process told it is in ``env``); False when a pod
        of its name exists. Invalid when the platform refuses it."""

    async def delete_pod(self, name: str, grace_s: int | None = None) -> bool:
        """Stop the pod: SIGTERM, then ``grace_s`` seconds (None: the pod's own) before it
        is killed; False when it is gone."""

    async def prepare(self, job: JobView) -> None:
        """Make what the job's pods need before they start (Kubernetes: the Service its
        elastic roles rendezvous at; the local platform's pods meet at 127.0.0.1)."""

    async def release(self, job: str) -> None:
        """Remove what ``prepare`` made, and the job's warm spares, once it is gone."""

    async def keep_spares(self, job: JobView, pods: Sequence[PodView], env: str) -> None:
        """Keep the warm spares the job's in-place roles ask for (``elastic.spares``),
        given its pods as observed now: started while it runs, ended once it ended or is
        suspended. ``create_pod`` admits one instead of a cold start where one fits. A
        no-op where the platform keeps them by itself (the local platform's node agent)."""

    def watch(
        self, kind: WatchKind, resource_version: str, timeout_s: int
    ) -> AsyncIterator[WatchEvent]:
        """Changes from ``resource_version`` on, until ``timeout_s`` or the platform ends
        the watch; Expired when events were lost (the caller lists again)."""

    # -- what its jobs can express (pure) -------------------------------------------------

    def plan_change(self, job: JobView, pods: Sequence[PodView], plan: ScalePlan) -> PlanChange:
        """``plan`` as a change of ``job``, given its pods as observed now; PlanRejected
        says why it cannot apply."""

    def not_applied(self, plan: ScalePlan) -> tuple[NotApplied, ...]:
        """The parts of ``plan`` no change of a job here applies: a function of the plan
        alone, so a plan finished after a restart is answered the same way."""

    def outcome(self, job: JobView, pods: Sequence[PodView]) -> tuple[str | None, str]:
        """(Succeeded | Failed | None, reason): whether the job ended, from its pods by the
        reconciler's rules, or as its own controller says."""


#: What a watch of hosts yields: ADDED, MODIFIED or DELETED with the Host, BOOKMARK.
HostChange = tuple[str, Host | Bookmark]


class CapacitySource(Protocol):
    """A platform that says what its cluster has: Kubernetes from its Nodes' allocatable
    GPUs (cordoned and NotReady ones unschedulable), the local platform from its slots.
    Listed and watched with the one informer, as jobs and pods are."""

    async def list_hosts(self) -> tuple[list[Host], str]:
        """Every host jobs may run on, and the version a watch goes on from."""

    def watch_hosts(self, resource_version: str, timeout_s: int) -> AsyncIterator[HostChange]:
        """Changes of hosts from ``resource_version`` on, until ``timeout_s``; Expired
        when events were lost."""
