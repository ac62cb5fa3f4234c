"""The cluster as the reconciler's pure decisions see it: jobs and pods as plain values.

Parsed once from the API's JSON (dicts, as watches deliver them) so that every decision
(which pods to create or delete, which events a pod's state means) is a function of values
that unit tests can build by hand.

Pods are named ``<job>-<role>-<index>`` and labelled with their job, role and rank. The
rank is the node's id towards the brain (NodeRef.id) and stays with the node when it is
migrated; the index only makes names unique, so a migrated node's new pod (created before
the old one goes) gets a new index and keeps the rank.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from handlers.operator.quantity import QuantityError, Resources

DOMAIN = "dlrover-events.io"
LABEL_JOB = f"{DOMAIN}/job"
LABEL_JOB_UID = f"{DOMAIN}/job-uid"
LABEL_ROLE = f"{DOMAIN}/role"
LABEL_RANK = f"{DOMAIN}/rank"
LABEL_INDEX = f"{DOMAIN}/index"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "dlrover-events-operator"

#: Who a job is, as config documents and the brain's history target it (JobMeta's user,
#: group, cluster, scenario, app): labels of the job object, so that ``kubectl get tj -l
#: dlrover-events.io/user=alice`` finds them, a PyTorchJob carries them the same way, and
#: the CRD's schema need not change. The pods get them as DLROVER_EVENTS_<NAME> variables.
IDENTITY_LABELS = {
    attr: f"{DOMAIN}/{attr}" for attr in ("user", "group", "cluster", "scenario", "app")
}

#: On a pod: the container that has the node's resources and runs the training command
#: (the role's ``container``; absent: the first), and the GPU type its node selector asks.
ANN_CONTAINER = f"{DOMAIN}/container"
ANN_GPU_TYPE = f"{DOMAIN}/gpu-type"

#: JSON list of the last plan ids applied to the job's spec, written in the same patch as
#: the spec change: a plan delivered again after a crash finds its change already made.
ANN_PLANS = f"{DOMAIN}/applied-plans"
#: JSON {role: {rank: resources}}: nodes that a plan migrated to other resources than the
#: role's (the schema has no per-node field, and pruning would drop one).
ANN_NODE_RESOURCES = f"{DOMAIN}/node-resources"
#: JSON {role: [rank, ...]}: ranks a plan removed by name; scaling down takes them first.
ANN_REMOVE_FIRST = f"{DOMAIN}/remove-first"
#: How many applied plan ids a job remembers (older ones are in the env's ledger).
PLAN_MEMORY = 32

ROLE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")

PENDING, RUNNING, SUCCEEDED, FAILED = "Pending", "Running", "Succeeded", "Failed"
FINAL_PHASES = (SUCCEEDED, FAILED)


class InvalidJob(ValueError):
    """The job's spec breaks a rule the v1.20 schema cannot express."""


#: Where torch's c10d rendezvous store listens when the spec does not say (in place: the
#: job's membership store).
DEFAULT_RENDEZVOUS_PORT = 29400
#: The elastic modes of a role (spec.roles.R.elastic.mode).
RESTART = "restart"
IN_PLACE = "inPlace"
ELASTIC_MODES = (RESTART, IN_PLACE)
#: Warm spares per role at most: each is a process holding its model in memory.
MAX_SPARES = 16


@dataclass(frozen=True)
class ElasticPolicy:
    """A role whose pods run under torchrun's elastic agent (spec.roles.R.elastic).

    ``command`` empty: the first container's own command and args are the training
    command. Rank 0 of the role hosts the rendezvous store, so it is never scaled away.
    """

    command: tuple[str, ...] = ()
    rendezvous_port: int = DEFAULT_RENDEZVOUS_PORT
    nproc_per_node: int = 1
    max_restarts: int = 100
    #: ``restart`` (torchrun's agents re-rendezvous and restart every worker) or
    #: ``inPlace`` (the workers re-form their group themselves: dlrover_events.sdk.inplace)
    mode: str = "restart"
    #: warm spare processes the platform keeps ready for a scale-up (in place only)
    spares: int = 0

    #: the pod rank that hosts the rendezvous store
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
    template: Mapping[str, Any]
    elastic: ElasticPolicy | None = None
    #: the template's container that gets the node's resources (None: the first)
    container: str | None = None


@dataclass(frozen=True)
class JobView:
    name: str
    namespace: str
    uid: str
    resource_version: str
    generation: int
    roles: Mapping[str, RoleView]
    labels: Mapping[str, str] = field(default_factory=dict)
    #: role -> rank -> resources a plan gave that node
    node_resources: Mapping[str, Mapping[int, Resources]] = field(default_factory=dict)
    remove_first: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    applied_plans: tuple[str, ...] = ()
    phase: str | None = None
    last_plan_id: str | None = None
    status: Mapping[str, Any] = field(default_factory=dict)
    #: spec.successPolicy.roles: the roles whose pods all succeeding ends the job (empty:
    #: the default, see planning.success_roles)
    success_roles: tuple[str, ...] = ()

    def wanted(self, role: str, rank: int) -> Resources:
        """The resources a new pod of that node gets."""
        return self.node_resources.get(role, {}).get(rank) or self.roles[role].resources

    def identity(self) -> dict[str, str]:
        """user, group, cluster, scenario, app from the job's labels (absent: not set)."""
        return {a: self.labels[k] for a, k in IDENTITY_LABELS.items() if self.labels.get(k)}


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
    node_name: str | None = None

    @property
    def running(self) -> bool:
        return self.phase == RUNNING

    @property
    def finished(self) -> bool:
        return self.phase in FINAL_PHASES


def pod_name(job: str, role: str, index: int) -> str:
    return f"{job}-{role}-{index}"


def _int_keys(raw: Mapping[str, Any]) -> dict[int, Any]:
    return {int(k): v for k, v in raw.items()}


def _annotation(meta: Mapping[str, Any], key: str, default: Any) -> Any:
    text = (meta.get("annotations") or {}).get(key)
    if not text:
        return default
    try:
        return json.loads(text)
    except ValueError as e:
        raise InvalidJob(f"annotation {key} is not JSON: {e}") from None


def object_fields(meta: Mapping[str, Any]) -> dict[str, Any]:
    """What a JobView of any kind takes from its object's metadata."""
    return {
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", ""),
        "uid": meta.get("uid", ""),
        "resource_version": meta.get("resourceVersion", ""),
        "generation": int(meta.get("generation") or 0),
        "labels": dict(meta.get("labels") or {}),
    }


def parse_job(obj: Mapping[str, Any]) -> JobView:
    """A TrainingJob from the API (a dict); InvalidJob names what the schema let through."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    roles: dict[str, RoleView] = {}
    for name, role in (spec.get("roles") or {}).items():
        if not ROLE_NAME.match(name):
            raise InvalidJob(f"role name {name!r} must be a DNS label of at most 40 characters")
        replicas = int(role.get("replicas", 0))
        low, high = role.get("minReplicas"), role.get("maxReplicas")
        if low is not None and high is not None and low > high:
            raise InvalidJob(f"role {name}: minReplicas {low} > maxReplicas {high}")
        try:
            resources = Resources.from_spec(role.get("resources"))
        except QuantityError as e:
            raise InvalidJob(f"role {name}: {e}") from None
        template = role.get("template") or {}
        container = role.get("container")
        if container is not None:
            names = [c.get("name") for c in (template.get("spec") or {}).get("containers") or []]
            if container not in names:
                raise InvalidJob(
                    f"role {name}: container {container!r} is not in its template "
                    f"(containers: {', '.join(map(str, names)) or 'none'})"
                )
        roles[name] = RoleView(
            name=name,
            replicas=replicas,
            min_replicas=low,
            max_replicas=high,
            resources=resources,
            restart_policy=role.get("restartPolicy", "OnFailure"),
            template=template,
            elastic=_elastic(name, role.get("elastic")),
            container=container,
        )
    if not roles:
        raise InvalidJob("the job has no roles")
    success_roles = _success_roles(spec.get("successPolicy"), roles)
    overrides = _annotation(meta, ANN_NODE_RESOURCES, {})
    try:
        node_resources = {
            role: {rank: Resources.from_spec(res) for rank, res in _int_keys(ranks).items()}
            for role, ranks in overrides.items()
        }
        remove_first = {
            role: tuple(int(r) for r in ranks)
            for role, ranks in _annotation(meta, ANN_REMOVE_FIRST, {}).items()
        }
    except (AttributeError, TypeError, ValueError) as e:
        raise InvalidJob(f"per-node annotations: {e}") from None
    return JobView(
        **object_fields(meta),
        roles=roles,
        node_resources=node_resources,
        remove_first=remove_first,
        applied_plans=tuple(_annotation(meta, ANN_PLANS, [])),
        phase=status.get("phase"),
        last_plan_id=status.get("lastPlanId"),
        status=status,
        success_roles=success_roles,
    )


def _success_roles(raw: Any, roles: Mapping[str, RoleView]) -> tuple[str, ...]:
    """spec.successPolicy.roles, in order, each once; a role the job lacks is a mistake
    the schema cannot catch (it cannot relate a list to the keys of a map)."""
    if raw is None:
        return ()
    named = raw.get("roles") if isinstance(raw, Mapping) else None
    if named is None:
        return ()
    if not isinstance(named, (list, tuple)) or not all(isinstance(r, str) for r in named):
        raise InvalidJob("successPolicy.roles must be a list of role names")
    unknown = [r for r in named if r not in roles]
    if unknown:
        raise InvalidJob(
            f"successPolicy names role(s) {', '.join(unknown)} the job does not have "
            f"(roles: {', '.join(roles)})"
        )
    return tuple(dict.fromkeys(named))


def _elastic(role: str, raw: Any) -> ElasticPolicy | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise InvalidJob(f"role {role}: elastic must be an object")
    command = raw.get("command") or ()
    if not isinstance(command, (list, tuple)) or not all(isinstance(c, str) for c in command):
        raise InvalidJob(f"role {role}: elastic.command must be a list of strings")
    try:
        policy = ElasticPolicy(
            command=tuple(command),
            rendezvous_port=int(raw.get("rendezvousPort") or DEFAULT_RENDEZVOUS_PORT),
            nproc_per_node=int(raw.get("nprocPerNode") or 1),
            max_restarts=int(raw.get("maxRestarts", 100)),
            mode=str(raw.get("mode") or RESTART),
            spares=int(raw.get("spares") or 0),
        )
    except (TypeError, ValueError) as e:
        raise InvalidJob(f"role {role}: elastic: {e}") from None
    if policy.mode not in ELASTIC_MODES:
        raise InvalidJob(
            f"role {role}: elastic.mode must be one of {', '.join(ELASTIC_MODES)}, "
            f"got {policy.mode!r}"
        )
    if not 0 <= policy.spares <= MAX_SPARES:
        raise InvalidJob(f"role {role}: elastic.spares must be 0..{MAX_SPARES}")
    if policy.spares and not policy.in_place:
        raise InvalidJob(
            f"role {role}: elastic.spares needs elastic.mode {IN_PLACE} (a spare is admitted "
            "into a running group; the restart mode restarts every worker anyway)"
        )
    if not 1 <= policy.rendezvous_port <= 65535:
        raise InvalidJob(f"role {role}: elastic.rendezvousPort must be 1..65535")
    if not 1 <= policy.nproc_per_node <= 64 or not 0 <= policy.max_restarts <= 10000:
        raise InvalidJob(f"role {role}: elastic.nprocPerNode 1..64, maxRestarts 0..10000")
    return policy


def check_bounds(job: JobView) -> None:
    """min <= replicas <= max per role: the schema of v1.20 cannot say it."""
    for role in job.roles.values():
        if role.min_replicas is not None and role.replicas < role.min_replicas:
            raise InvalidJob(
                f"role {role.name}: {role.replicas} replicas, below minReplicas {role.min_replicas}"
            )
        if role.max_replicas is not None and role.replicas > role.max_replicas:
            raise InvalidJob(
                f"role {role.name}: {role.replicas} replicas, above maxReplicas {role.max_replicas}"
            )


def _termination(status: Mapping[str, Any]) -> Termination | None:
    """The first container that ended, an OOM kill before any other ending."""
    found: list[Termination] = []
    for c in status.get("containerStatuses") or []:
        for state in (c.get("state") or {}, c.get("lastState") or {}):
            ended = state.get("terminated")
            if ended:
                found.append(
                    Termination(
                        c.get("name", ""), int(ended.get("exitCode", 0)), ended.get("reason") or ""
                    )
                )
    if not found:
        return None
    return next((t for t in found if t.oom), found[0])


def parse_pod(obj: Mapping[str, Any]) -> PodView | None:
    """One of our pods from the API (a dict); None for a pod that is not one of a job's."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    try:
        role, rank, index = labels[LABEL_ROLE], int(labels[LABEL_RANK]), int(labels[LABEL_INDEX])
        job = labels[LABEL_JOB]
    except (KeyError, ValueError):
        return None
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    annotations = meta.get("annotations") or {}
    containers = spec.get("containers") or [{}]
    named = annotations.get(ANN_CONTAINER)
    container = next((c for c in containers if named and c.get("name") == named), containers[0])
    try:
        resources = Resources.from_container(container)
    except QuantityError:
        resources = Resources()
    if annotations.get(ANN_GPU_TYPE):
        resources = replace(resources, gpu_type=annotations[ANN_GPU_TYPE])
    return PodView(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        job=job,
        job_uid=labels.get(LABEL_JOB_UID, ""),
        role=role,
        rank=rank,
        index=index,
        phase=status.get("phase") or PENDING,
        deleting=meta.get("deletionTimestamp") is not None,
        resources=resources,
        termination=_termination(status),
        node_name=spec.get("nodeName"),
    )


__all__ = [
    "ANN_CONTAINER",
    "ANN_GPU_TYPE",
    "ANN_NODE_RESOURCES",
    "ANN_PLANS",
    "ANN_REMOVE_FIRST",
    "DEFAULT_RENDEZVOUS_PORT",
    "ELASTIC_MODES",
    "FAILED",
    "FINAL_PHASES",
    "IDENTITY_LABELS",
    "IN_PLACE",
    "LABEL_INDEX",
    "LABEL_JOB",
    "LABEL_JOB_UID",
    "LABEL_MANAGED_BY",
    "LABEL_RANK",
    "LABEL_ROLE",
    "MANAGED_BY",
    "MAX_SPARES",
    "PENDING",
    "PLAN_MEMORY",
    "RESTART",
    "RUNNING",
    "SUCCEEDED",
    "ElasticPolicy",
    "InvalidJob",
    "JobView",
    "PodView",
    "RoleView",
    "Termination",
    "check_bounds",
    "object_fields",
    "parse_job",
    "parse_pod",
    "pod_name",
]
