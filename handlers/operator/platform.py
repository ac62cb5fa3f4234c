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
by ``JobSpecChange.suspend`` on a platform whose ``suspends`` is true: TrainingJob
``spec.suspend``, PyTorchJob ``spec.runPolicy.suspend``, the field Kueue uses), who admitted
or suspended it and why (``JobAdmission``, kept on the job in the same write as the
suspend), and the cluster's capacity (``Host``s and their allocatable GPUs, schedulable or
not: a Kubernetes cluster's Nodes, the local platform's slots), listed and watched from a
``CapacitySource``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from dlrover_events.domain.units import human_bytes
from schemas.plans import NodeResource, NotApplied, ScalePlan

# -- bodies ---------------------------------------------------------------------------------

PENDING, RUNNING, SUCCEEDED, FAILED = "Pending", "Running", "Succeeded", "Failed"
FINAL_PHASES = (SUCCEEDED, FAILED)

DOMAIN = "dlrover-events.io"
#: Who a job is, as config documents and the brain's history target it (JobMeta's user,
#: group, cluster, scenario, app): labels of the job, so that ``kubectl get tj -l
#: dlrover-events.io/user=alice`` finds them and a PyTorchJob carries them the same way.
#: The pods get them as DLROVER_EVENTS_<NAME> variables.
IDENTITY_LABELS = {
    attr: f"{DOMAIN}/{attr}" for attr in ("user", "group", "cluster", "scenario", "app")
}

#: Where torch's c10d rendezvous store listens when the job does not say (in place: the
#: job's membership store).
DEFAULT_RENDEZVOUS_PORT = 29400
#: The elastic modes of a role.
RESTART = "restart"
IN_PLACE = "inPlace"
ELASTIC_MODES = (RESTART, IN_PLACE)
#: Warm spares per role at most: each is a process holding its model in memory.
MAX_SPARES = 16

#: Kueue's label naming the LocalQueue that admits a job: such a job is Kueue's to admit
#: and suspend, never this operator's nor the brain's.
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: A job's priority under a cluster scheduler (an integer, higher first): a label, since a
#: Kubernetes PriorityClass is a name, not a number, and a PyTorchJob's schema is not ours.
PRIORITY_LABEL = f"{DOMAIN}/priority"

#: A job's admission states, as `job list` shows them: created suspended, waiting for the
#: cluster scheduler; admitted (or resumed) by a plan; suspended (by a plan, its user, or
#: Kueue).
QUEUED, ADMITTED, SUSPENDED = "queued", "admitted", "suspended"
#: The type of the job status condition that says whether it is suspended, and why.
SUSPENDED_CONDITION = "Suspended"


@dataclass(frozen=True, slots=True)
class Resources:
    """One node's resources, in numbers; None = not set."""

    cpu_milli: int | None = None
    memory: int | None = None
    gpu: int | None = None
    gpu_type: str | None = None

    def updated(self, change: NodeResource, *, gpu_type: bool = True) -> Resources:
        """``change`` on top; a plan's 0 (or "") means unchanged. ``gpu_type`` False: the
        platform cannot select a GPU type, so the plan's is not taken into the job."""
        return Resources(
            cpu_milli=round(change.cpu * 1000) if change.cpu else self.cpu_milli,
            memory=change.memory or self.memory,
            gpu=change.gpu_num or self.gpu,
            gpu_type=(change.gpu_type if gpu_type else "") or self.gpu_type,
        )

    def over(self, base: Resources) -> Resources:
        """These resources, with what they leave unset taken from ``base``."""
        return Resources(
            cpu_milli=base.cpu_milli if self.cpu_milli is None else self.cpu_milli,
            memory=base.memory if self.memory is None else self.memory,
            gpu=base.gpu if self.gpu is None else self.gpu,
            gpu_type=base.gpu_type if self.gpu_type is None else self.gpu_type,
        )

    def covers(self, wanted: Resources) -> bool:
        """Whether a pod with these resources is what ``wanted`` asks for (unset = any)."""
        return all(
            w is None or w == mine
            for w, mine in (
                (wanted.cpu_milli, self.cpu_milli),
                (wanted.memory, self.memory),
                (wanted.gpu, self.gpu),
                (wanted.gpu_type, self.gpu_type),
            )
        )

    def describe(self) -> str:
        """As a result's reason says it: ``cpu 1.5, memory 4 GiB, 1 GPU (A100)``."""
        parts = []
        if self.cpu_milli is not None:
            parts.append(f"cpu {self.cpu_milli / 1000:g}")
        if self.memory is not None:
            parts.append(f"memory {human_bytes(self.memory)}")
        if self.gpu is not None:
            parts.append(f"{self.gpu} GPU" + ("" if self.gpu == 1 else "s"))
        if self.gpu_type is not None:
            parts.append(f"GPU type {self.gpu_type}")
        return ", ".join(parts) or "no resources set"


@dataclass(frozen=True)
class ElasticPolicy:
    """A role whose pods run under torchrun's elastic agent.

    ``command`` empty: the training container's own command and args are the training
    command. Rank ``host_rank`` of the role hosts the rendezvous store, so it is never
    scaled away.
    """

    command: tuple[str, ...] = ()
    rendezvous_port: int = DEFAULT_RENDEZVOUS_PORT
    nproc_per_node: int = 1
    max_restarts: int = 100
    #: ``restart`` (torchrun's agents re-rendezvous and restart every worker) or
    #: ``inPlace`` (the workers re-form their group themselves: dlrover_events.sdk.inplace)
    mode: str = RESTART
    #: warm spare processes the platform keeps ready for a scale-up (in place only)
    spares: int = 0
    #: the pod rank that hosts the rendezvous store (-1: a host outside the job)
    host_rank: int = 0

    @property
    def in_place(self) -> bool:
        return self.mode == IN_PLACE


@dataclass(frozen=True)
class RoleView:
    name: str
    replicas: int
    min_replicas: int | None
    max_replicas: int | None
    resources: Resources
    restart_policy: str
    #: the role's pod template as its job gives it: Kubernetes builds pods on it
    template: Mapping[str, Any]
    elastic: ElasticPolicy | None = None
    #: the template's container that gets the node's resources (None: the first)
    container: str | None = None
    #: that container's command and args (a platform that runs no container runs these)
    command: tuple[str, ...] = ()
    #: the plain variables the template's containers set
    env: Mapping[str, str] = field(default_factory=dict)
    #: seconds a removed pod has to stop (None: the platform's default)
    grace_s: int | None = None
    #: what the training container asks for by itself (a node's resources go on top)
    template_resources: Resources = field(default_factory=Resources)


@dataclass(frozen=True)
class JobAdmission:
    """Who let a job run or stopped it, and why: written on the job in the same change as
    its suspend (so a restarted operator finds both or neither), shown as the job's
    ``Suspended`` condition."""

    #: QUEUED, ADMITTED or SUSPENDED
    state: str
    #: the condition's reason, one CamelCase word (Queued, Admitted, Resumed, Preempted)
    reason: str
    message: str
    #: the plan that admitted, resumed or suspended it (None: the operator itself)
    plan_id: str | None = None

    @property
    def suspended(self) -> bool:
        return self.state != ADMITTED


@dataclass(frozen=True)
class JobCondition:
    """A condition of a job's status, as Kubernetes writes them (``Suspended``)."""

    type: str
    status: bool
    reason: str
    message: str
    #: when ``status`` last changed (None: not said)
    since: str | None = None


@dataclass(frozen=True)
class OperatorJobStatus:
    """What this operator says of a job on the job itself (the `job` commands show it)."""

    phase: str
    #: role -> pending/running/succeeded/failed pods
    roles: Mapping[str, Mapping[str, int]]
    #: the job's generation the status was written for (None: not said)
    observed_generation: int | None
    last_plan_id: str | None = None
    last_plan_time: str | None = None
    #: the job's ``Suspended`` condition (None: it never was, nor was it queued)
    suspended: JobCondition | None = None


@dataclass(frozen=True)
class JobView:
    name: str
    namespace: str
    uid: str
    #: the version this view was read at: a change made on it fails (Conflict) if the
    #: job changed since
    resource_version: str
    generation: int
    roles: Mapping[str, RoleView]
    labels: Mapping[str, str] = field(default_factory=dict)
    #: role -> rank -> resources a plan gave that node
    node_resources: Mapping[str, Mapping[int, Resources]] = field(default_factory=dict)
    #: role -> ranks a plan removed by name (scaling down takes them first)
    remove_first: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    #: the last plan ids applied to the job (PLAN_MEMORY of them)
    applied_plans: tuple[str, ...] = ()
    phase: str | None = None
    last_plan_id: str | None = None
    #: what this operator last wrote on the job (None: nothing yet, or the job's status
    #: is its own controller's, as a PyTorchJob's)
    status: OperatorJobStatus | None = None
    #: the roles whose pods all succeeding ends the job (empty: the default, see
    #: planning.success_roles)
    success_roles: tuple[str, ...] = ()
    #: why the job's own controller gave it its phase (a PyTorchJob's condition)
    phase_message: str = ""
    #: whether the job is suspended: no pods, its place and progress kept (its spec says
    #: so: TrainingJob spec.suspend, PyTorchJob spec.runPolicy.suspend)
    suspended: bool = False
    #: who admitted or suspended it last, and why (None: no one: it runs as submitted,
    #: or its user or Kueue set its suspend)
    admission: JobAdmission | None = None
    #: the batch it says it trains with (None: it does not say)
    batch: JobBatch | None = None
    #: the job as its platform keeps it (a TrainingJob document), for the doors that show
    #: it to a user; no decision reads it
    document: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def wanted(self, role: str, rank: int) -> Resources:
        """The resources a new pod of that node gets."""
        return self.node_resources.get(role, {}).get(rank) or self.roles[role].resources

    def identity(self) -> dict[str, str]:
        """user, group, cluster, scenario, app from the job's labels (absent: not set)."""
        return {a: self.labels[k] for a, k in IDENTITY_LABELS.items() if self.labels.get(k)}

    @property
    def kueue_queue(self) -> str | None:
        """The Kueue LocalQueue that admits the job (None: Kueue does not manage it)."""
        return self.labels.get(KUEUE_QUEUE_LABEL) or None

    @property
    def priority(self) -> int:
        """Its priority label's number (0 unsaid); the job's parser refuses a bad one."""
        text = self.labels.get(PRIORITY_LABEL)
        return int(text) if text else 0


@dataclass(frozen=True)
class JobBatch:
    """The batch a job says it trains with (TrainingJob ``spec.batch``): what a cluster
    scheduler needs to choose an allocation's batch for it. A job that says none is
    scheduled as the gang of workers it asked for."""

    #: the global batch it starts with
    size: int
    #: the smallest global batch it converges at, the largest it may grow to
    min_size: int | None = None
    max_size: int | None = None
    #: the local (per worker) batch it can train with
    min_local: int | None = None
    max_local: int | None = None
    #: whether the brain may change its batch (through training knobs, at a step boundary)
    adaptive: bool = False


@dataclass(frozen=True)
class UnreadableJob:
    """A job the platform holds but the decisions cannot use; ``reason`` says why."""

    name: str
    uid: str
    resource_version: str
    reason: str


@dataclass(frozen=True)
class Termination:
    container: str
    exit_code: int
    reason: str

    @property
    def oom(self) -> bool:
        """The kernel's OOM killer: the reason says so, or SIGKILL's 137 says it for it."""
        return self.reason == "OOMKilled" or self.exit_code == 137


@dataclass(frozen=True)
class PodView:
    name: str
    uid: str
    job: str
    job_uid: str
    role: str
    rank: int
    index: int
    phase: str
    deleting: bool
    resources: Resources
    termination: Termination | None = None
    #: the host it runs on, where the platform says
    node_name: str | None = None
    resource_version: str = ""

    @property
    def running(self) -> bool:
        return self.phase == RUNNING

    @property
    def finished(self) -> bool:
        return self.phase in FINAL_PHASES


def pod_name(job: str, role: str, index: int) -> str:
    """Pods are named ``<job>-<role>-<index>``: decided, not random, so a create that a
    restarted operator repeats meets the pod it made, not a second one."""
    return f"{job}-{role}-{index}"


@dataclass(frozen=True)
class NewPod:
    """A pod the reconciler asks for: the node (role, rank), the index that makes its name
    unique, and its resources."""

    role: str
    rank: int
    index: int
    resources: Resources

    def name(self, job: str) -> str:
        return pod_name(job, self.role, self.index)


@dataclass(frozen=True)
class JobSpecChange:
    """What a plan changes in a job's desired state, written in one step with the plan's
    id, so a plan delivered again after a crash finds its change made. Written only on the
    version it was decided on (``resource_version``): else Conflict, and the reconciler
    decides again on what the job is now."""

    resource_version: str
    #: the plan ids applied, this one last
    applied_plans: tuple[str, ...]
    #: the roles whose replicas change, and to what
    replicas: Mapping[str, int] = field(default_factory=dict)
    #: the roles whose resources change, and to what
    resources: Mapping[str, Resources] = field(default_factory=dict)
    #: every node with resources of its own after the plan (role -> rank -> resources)
    node_resources: Mapping[str, Mapping[int, Resources]] = field(default_factory=dict)
    #: every rank a plan removed by name, per role, after the plan
    remove_first: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    #: suspend (True) or resume (False) the job; None: as it is
    suspend: bool | None = None
    #: who admits or suspends it now, and why (None: as it is)
    admission: JobAdmission | None = None


@dataclass(frozen=True)
class PlanChange:
    """A plan as a change of the job, and what the result says of it."""

    change: JobSpecChange
    summary: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Bookmark:
    """A watch's word that it has seen up to ``resource_version`` (no object changed)."""

    resource_version: str


@dataclass(frozen=True)
class Host:
    """A machine the platform places pods on (a Kubernetes Node; this machine)."""

    name: str
    #: GPUs it can give pods (a Node's allocatable; the local platform's slots)
    gpus: int
    #: False: cordoned, NotReady, or otherwise taking no new pods
    schedulable: bool = True
    gpu_type: str | None = None
    #: the version it was read at (a watch of hosts goes on from it)
    resource_version: str = field(default="", compare=False)


@dataclass(frozen=True)
class Capacity:
    """What the cluster has for jobs now (issue 26: the cluster scheduler's input)."""

    hosts: tuple[Host, ...]

    @property
    def gpus(self) -> int:
        return sum(h.gpus for h in self.hosts if h.schedulable)


# -- errors ---------------------------------------------------------------------------------


class PlatformError(Exception):
    """A platform refused a call or could not make it; the message says why, in one line."""


class ObjectNotFound(PlatformError):
    """No such job or pod (any more)."""


class Conflict(PlatformError):
    """The job changed since the version the change was decided on, or a job of that
    name exists."""


class Invalid(PlatformError):
    """The platform refuses what it was given (its schema, a quota, its admission)."""


class Expired(PlatformError):
    """A watch fell behind and events were lost: list again."""


class Unavailable(PlatformError):
    """The platform cannot answer now (away, overloaded, refusing this operator): try
    again later."""


class NotLeader(PlatformError):
    """A write refused because this replica no longer holds the operator's lease: the
    plan it served is left to the leader (its delivery is not committed here)."""


class InvalidJob(ValueError):
    """A job breaks a rule its platform's schema cannot express (min <= replicas <= max,
    a role named in the success policy, ...); the message says which."""


class PlanRejected(ValueError):
    """The plan cannot apply to this job; the message is the result's reason."""


# -- the port -------------------------------------------------------------------------------

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
    #: whether a JobSpecChange's ``suspend`` is honoured: a suspended job's pods are deleted
    #: (with their grace period) and its place kept, for a cluster scheduler's queue and
    #: preemption
    suspends: bool

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


class FencedPlatform:
    """A platform whose every write first asks ``may_act`` (the lease held, by this
    replica's clock) and raises NotLeader when not: a leader that lost its lease stops
    changing the cluster at once, even in the middle of a plan. Reads pass through."""

    def __init__(self, platform: Platform, may_act: Callable[[], bool]) -> None:
        self.platform = platform
        self.may_act = may_act
        self.name = platform.name
        self.namespace = platform.namespace
        self.creates_pods = platform.creates_pods
        self.suspends = platform.suspends

    def _check(self, what: str) -> None:
        if not self.may_act():
            raise NotLeader(f"not the leader any more: {what} refused")

    async def list_jobs(self) -> tuple[list[JobEntry], str]:
        return await self.platform.list_jobs()

    async def get_job(self, name: str) -> JobEntry | None:
        return await self.platform.get_job(name)

    async def submit_job(self, document: Mapping[str, Any]) -> JobView:
        self._check("submit job")
        return await self.platform.submit_job(document)

    async def change_job(self, job: JobView, change: JobSpecChange) -> JobView:
        self._check(f"change job {job.name}")
        return await self.platform.change_job(job, change)

    async def set_status(self, job: JobView, status: OperatorJobStatus) -> None:
        self._check(f"status of job {job.name}")
        await self.platform.set_status(job, status)

    async def delete_job(self, name: str) -> bool:
        self._check(f"delete job {name}")
        return await self.platform.delete_job(name)

    async def list_pods(self, job: str | None = None) -> tuple[list[PodView], str]:
        return await self.platform.list_pods(job)

    async def create_pod(self, job: JobView, pod: NewPod, env: str) -> bool:
        self._check(f"create pod {pod.name(job.name)}")
        return await self.platform.create_pod(job, pod, env)

    async def delete_pod(self, name: str, grace_s: int | None = None) -> bool:
        self._check(f"delete pod {name}")
        return await self.platform.delete_pod(name, grace_s)

    async def prepare(self, job: JobView) -> None:
        self._check(f"prepare job {job.name}")
        await self.platform.prepare(job)

    async def release(self, job: str) -> None:
        self._check(f"release job {job}")
        await self.platform.release(job)

    async def keep_spares(self, job: JobView, pods: Sequence[PodView], env: str) -> None:
        self._check(f"warm spares of job {job.name}")
        await self.platform.keep_spares(job, pods, env)

    def watch(
        self, kind: WatchKind, resource_version: str, timeout_s: int
    ) -> AsyncIterator[WatchEvent]:
        return self.platform.watch(kind, resource_version, timeout_s)

    def plan_change(self, job: JobView, pods: Sequence[PodView], plan: ScalePlan) -> PlanChange:
        return self.platform.plan_change(job, pods, plan)

    def not_applied(self, plan: ScalePlan) -> tuple[NotApplied, ...]:
        return self.platform.not_applied(plan)

    def outcome(self, job: JobView, pods: Sequence[PodView]) -> tuple[str | None, str]:
        return self.platform.outcome(job, pods)


# -- the registry ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PlatformEntry:
    """Where a platform's two doors are, as "module:function": imported only once chosen,
    so a process on the local platform never loads a Kubernetes client, and a virtual
    env's operator neither platform."""

    #: its operator: (ServiceContext, options) -> runs until the context's stop
    operator: str
    #: its jobs for the `job` commands: (Settings, env, options) -> an async context
    #: manager of a Platform
    jobs: str


#: platform name -> its entry. Add a platform here (and its module beside kube/ and local/).
PLATFORMS: Mapping[str, PlatformEntry] = {
    "kubernetes": PlatformEntry(
        operator="handlers.operator.kube.runner:run",
        jobs="handlers.operator.kube.runner:open_jobs",
    ),
    "local": PlatformEntry(
        operator="handlers.operator.local.runner:run",
        jobs="handlers.operator.local.runner:open_jobs",
    ),
}
DEFAULT_PLATFORM = "kubernetes"


__all__ = [
    "ADMITTED",
    "DEFAULT_PLATFORM",
    "DEFAULT_RENDEZVOUS_PORT",
    "DOMAIN",
    "ELASTIC_MODES",
    "FAILED",
    "FINAL_PHASES",
    "IDENTITY_LABELS",
    "IN_PLACE",
    "KUEUE_QUEUE_LABEL",
    "MAX_SPARES",
    "PENDING",
    "PLATFORMS",
    "PRIORITY_LABEL",
    "QUEUED",
    "RESTART",
    "RUNNING",
    "SUCCEEDED",
    "SUSPENDED",
    "SUSPENDED_CONDITION",
    "Bookmark",
    "Capacity",
    "CapacitySource",
    "Conflict",
    "ElasticPolicy",
    "Expired",
    "FencedPlatform",
    "Host",
    "HostChange",
    "Invalid",
    "InvalidJob",
    "JobAdmission",
    "JobBatch",
    "JobCondition",
    "JobEntry",
    "JobSpecChange",
    "JobView",
    "NewPod",
    "NotLeader",
    "ObjectNotFound",
    "OperatorJobStatus",
    "PlanChange",
    "PlanRejected",
    "Platform",
    "PlatformEntry",
    "PlatformError",
    "PodView",
    "Resources",
    "RoleView",
    "Termination",
    "Unavailable",
    "UnreadableJob",
    "WatchEvent",
    "WatchKind",
    "pod_name",
]
