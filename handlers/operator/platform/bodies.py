"""The platform port's bodies: jobs, pods, changes and hosts as typed values with numbers.

No Kubernetes object, quantity string or HTTP code: each platform converts at its own
edge (handlers.operator.platform.api says the contract).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dlrover_events.domain.units import human_bytes
from schemas.plans import NodeResource

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
    #: ``inPlace`` (the workers re-form their group themselves:
    #: dlrover_events.sdk.torch.inplace)
    mode: str = RESTART
    #: warm spare processes the platform keeps ready for a scale-up (in place only)
    spares: int = 0
    #: the pod rank that hosts the rendezvous store (-1: a host outside the job)
    host_rank: int = 0

    @property
    def in_place(self) -> bool:
        return self.mode == IN_PLACE


@dataclass(frozen=True)
class VolumeMount:
    """A job volume (``spec.volumes``) as a role mounts it (``roles.<r>.volumes``)."""

    name: str
    #: where the role's containers see it (a cluster); on one machine its host directory
    #: is what DLROVER_EVENTS_VOLUME_<NAME> says
    mount_path: str
    read_only: bool = False


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
    #: the port its pods listen on for the job's other roles (None: the default; the
    #: local platform gives each pod a port of its own)
    port: int | None = None
    #: roles whose pods must all be ready before this role's pods are made
    start_after: tuple[str, ...] = ()
    #: roles this role's pods may scale, within their bounds, with the job's token
    scales: tuple[str, ...] = ()
    #: the job volumes its pods mount
    volumes: tuple[VolumeMount, ...] = ()


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
    #: its volumes by name (``spec.volumes``: a Kubernetes volume's source, as given),
    #: mounted by the roles that name them
    volumes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
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
    #: ready: its readiness probe passes (a cluster) or its process said so through the
    #: SDK's ``ready()`` (the local platform); roles that start after its role wait for it
    ready: bool = False

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
class PlatformCapabilities:
    """What a platform's jobs can be asked for, declared by the platform itself: the
    reconciler's rules read it (``planning.plan_change``, what a result says was not
    applied), and the operator publishes it with the cluster's capacity, so the brain
    plans only what the platform can apply rather than learning it from rejections."""

    #: a plan's GPU type is honoured: pods select GPU types (Kubernetes with a GPU-type
    #: node label; never on one machine)
    gpu_types: bool = False
    #: warm spares of in-place elastic roles are kept (``elastic.spares``)
    spares: bool = False
    #: a job can be suspended and resumed, its place and progress kept (a cluster
    #: scheduler's queue and preemption)
    suspend: bool = False
    #: a node can be migrated: replaced by a new pod with resources of its own (False
    #: where another controller owns the pods: a PyTorchJob's training-operator)
    migrates_nodes: bool = True
    #: the node that hosts an elastic role's rendezvous (rank ``host_rank``: the c10d
    #: store every other node meets at) can be replaced or removed by name. False on a
    #: platform whose elastic pods host their store themselves: replacing that node would
    #: restart the whole job's rendezvous, so a plan that names it is rejected
    replaces_rendezvous_host: bool = False


@dataclass(frozen=True)
class Capacity:
    """What the cluster has for jobs now (issue 26: the cluster scheduler's input)."""

    hosts: tuple[Host, ...]

    @property
    def gpus(self) -> int:
        return sum(h.gpus for h in self.hosts if h.schedulable)
