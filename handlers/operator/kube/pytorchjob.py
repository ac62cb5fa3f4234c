"""Kubeflow's PyTorchJob (kubeflow.org/v1, deploy/crds/pytorchjobs.yaml): the
training-operator owns the pods, this operator only resizes the job.

What differs from a TrainingJob, and why:

- Pods: the training-operator creates ``<job>-<type>-<index>`` for index < replicas and
  deletes the indexes at or above it, so the operator creates and deletes none
  (``creates_pods = False``). A plan is one merge patch of
  ``spec.pytorchReplicaSpecs.<Type>`` (replicas, and the first container's resources in
  the template); the plan id goes into the same annotation as a TrainingJob's, in the same
  patch. The replica index is the node's rank towards the brain.
- Bounds: the Worker role is elastic only with ``spec.elasticPolicy``, between its
  ``minReplicas`` and ``maxReplicas`` (defaulted as the training-operator defaults them:
  one from the other, else the replicas): every pod's torchrun is started with
  ``--nnodes=min:max``, so a size outside them could never rendezvous. Master, and Worker
  without elasticPolicy, keep their size.
- What the training-operator cannot do is rejected, with why: removing a node other than
  the highest indexes (it always removes those), a node of its own resources (one
  template per replica type), migrating a node (it applies a template change only to the
  pods it creates later; nothing here deletes its pods).
- The job's end is the training-operator's to say (``status.conditions``): the operator
  writes no status and reads Succeeded / Failed from there.
- Suspend: ``spec.runPolicy.suspend`` (the field Kueue uses); the training-operator
  deletes the pods of a suspended job and creates them again when it is resumed.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from handlers.operator.document.quantity import (
    GPU,
    QuantityError,
    resources_from_container,
    resources_to_quantities,
)
from handlers.operator.document.trainingjob import ANN_PLANS, object_fields, plans_annotation
from handlers.operator.kube.adapter import WorkloadAdapter
from handlers.operator.kube.pods import (
    LABEL_INDEX,
    LABEL_JOB,
    LABEL_JOB_UID,
    LABEL_RANK,
    LABEL_ROLE,
    parse_pod,
)
from handlers.operator.platform.bodies import (
    DEFAULT_RENDEZVOUS_PORT,
    FAILED,
    PENDING,
    RUNNING,
    SUCCEEDED,
    ElasticPolicy,
    JobSpecChange,
    JobView,
    OperatorJobStatus,
    PlanChange,
    PlatformCapabilities,
    PodView,
    Resources,
    RoleView,
)
from handlers.operator.platform.errors import Invalid, InvalidJob, PlanRejected
from handlers.operator.reconcile import planning
from schemas.plan_parts import not_applied
from schemas.plans import NotApplied, ScalePlan

GROUP = "kubeflow.org"
VERSION = "v1"
PLURAL = "pytorchjobs"
KIND = "PyTorchJob"

# The training-operator's pod labels (kubeflow.org/v1 common types, v1.7 and later).
LABEL_JOB_NAME = "training.kubeflow.org/job-name"
LABEL_REPLICA_TYPE = "training.kubeflow.org/replica-type"  # lower case: worker, master
LABEL_REPLICA_INDEX = "training.kubeflow.org/replica-index"
LABEL_OPERATOR_NAME = "training.kubeflow.org/operator-name"
#: its PyTorchJob controller's name: TFJobs' and MPIJobs' pods carry the same job-name
#: label, and must not be taken for nodes of a PyTorchJob of the same name
OPERATOR_NAME = "pytorchjob-controller"

#: role (as plans and events name it) -> replica type (as the job's spec names it)
REPLICA_TYPES = {"master": "Master", "worker": "Worker"}
ELASTIC_ROLE = "worker"

#: status.conditions types, the first one True deciding the phase
_CONDITION_PHASES = (
    ("Failed", FAILED),
    ("Succeeded", SUCCEEDED),
    ("Suspended", "Suspended"),
    ("Restarting", "Restarting"),
    ("Running", RUNNING),
    ("Created", PENDING),
)

_POD_ASKS = f"a PyTorchJob's template asks only for cpu, memory and {GPU}"
UNSUPPORTED = {
    "gpu_type": f"{_POD_ASKS}: no GPU type",
    "gpu_memory": f"{_POD_ASKS}: no GPU memory size",
    "priority": f"{_POD_ASKS}: no priority",
}
#: said with every resource change: the training-operator does not restart running pods
LATER_PODS = "the training-operator gives new resources only to the pods it creates from now on"
#: What a PyTorchJob can be asked for: its replicas and its role's resources, its suspend
#: (``spec.runPolicy.suspend``); no GPU type, no warm spares, and no node migrated (its
#: pods are the training-operator's, made from one template per replica type).
CAPABILITIES = PlatformCapabilities(
    gpu_types=False,
    spares=False,
    suspend=True,
    migrates_nodes=False,
    replaces_rendezvous_host=False,
)


# -- job ---------------------------------------------------------------------------------


def _bounds(policy: Mapping[str, Any], replicas: int) -> tuple[int, int]:
    """elasticPolicy's bounds, defaulted as the training-operator defaults them."""
    low, high = policy.get("minReplicas"), policy.get("maxReplicas")
    low = high if low is None else low
    high = low if high is None else high
    if low is None or high is None:
        return replicas, replicas
    return int(low), int(high)


def _elastic(policy: Mapping[str, Any]) -> ElasticPolicy:
    """The Worker role's torchrun, as far as plans care: worker-0 hosts the rendezvous
    store unless ``rdzvHost`` names another host (then no pod does: host rank -1)."""
    try:
        return ElasticPolicy(
            rendezvous_port=int(policy.get("rdzvPort") or DEFAULT_RENDEZVOUS_PORT),
            max_restarts=int(policy.get("maxRestarts", 100)),
            host_rank=-1 if policy.get("rdzvHost") else 0,
        )
    except (TypeError, ValueError) as e:
        raise InvalidJob(f"elasticPolicy: {e}") from None


def conditions_phase(status: Mapping[str, Any]) -> tuple[str, str]:
    """(phase, message) from the training-operator's status.conditions."""
    true = {
        c.get("type"): c
        for c in status.get("conditions") or []
        if isinstance(c, Mapping) and c.get("status") == "True"
    }
    for kind, phase in _CONDITION_PHASES:
        if kind in true:
            cond = true[kind]
            return phase, str(cond.get("message") or cond.get("reason") or "")
    return PENDING, ""


def parse_pytorchjob(obj: Mapping[str, Any]) -> JobView:
    """A PyTorchJob from the API (a dict) as the pure decisions see a job."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    specs = spec.get("pytorchReplicaSpecs") or {}
    unknown = sorted(set(specs) - set(REPLICA_TYPES.values()))
    if unknown:
        raise InvalidJob(
            f"replica type {', '.join(unknown)}: a PyTorchJob has Master and Worker replicas"
        )
    policy = spec.get("elasticPolicy")
    roles: dict[str, RoleView] = {}
    for role, rtype in REPLICA_TYPES.items():
        replica = specs.get(rtype)
        if replica is None:
            continue
        replicas = int(replica.get("replicas", 1))
        template = replica.get("template") or {}
        containers = (template.get("spec") or {}).get("containers") or []
        if not containers:
            raise InvalidJob(f"{rtype}: the template has no containers")
        try:
            resources = resources_from_container(containers[0])
        except QuantityError as e:
            raise InvalidJob(f"{rtype}: {e}") from None
        elastic = None
        low, high = replicas, replicas
        if role == ELASTIC_ROLE and policy is not None:
            low, high = _bounds(policy, replicas)
            elastic = _elastic(policy)
            if low > high:
                raise InvalidJob(f"elasticPolicy: minReplicas {low} > maxReplicas {high}")
        roles[role] = RoleView(
            name=role,
            replicas=replicas,
            min_replicas=low,
            max_replicas=high,
            resources=resources,
            restart_policy=replica.get("restartPolicy", "OnFailure"),
            template=template,
            elastic=elastic,
        )
    if not roles:
        raise InvalidJob("the job has no Master or Worker replicas")
    text = (meta.get("annotations") or {}).get(ANN_PLANS)
    try:
        plans = tuple(str(p) for p in json.loads(text)) if text else ()
    except (TypeError, ValueError) as e:
        raise InvalidJob(f"annotation {ANN_PLANS} is not a JSON list: {e}") from None
    phase, message = conditions_phase(status)
    suspend = (spec.get("runPolicy") or {}).get("suspend", False)
    if not isinstance(suspend, bool):
        raise InvalidJob("spec.runPolicy.suspend must be true or false")
    return JobView(
        **object_fields(meta),
        roles=roles,
        applied_plans=plans,
        phase=phase,
        last_plan_id=plans[-1] if plans else None,
        phase_message=message,
        suspended=suspend,
        document=obj,
    )


def outcome(job: JobView) -> tuple[str | None, str]:
    """Whether the job ended, as the training-operator's conditions say (and why)."""
    if job.phase == SUCCEEDED:
        return SUCCEEDED, job.phase_message
    if job.phase == FAILED:
        return FAILED, job.phase_message or "the training-operator marked the PyTorchJob Failed"
    return None, ""


# -- pods --------------------------------------------------------------------------------


def _owner_uid(meta: Mapping[str, Any]) -> str:
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("controller"):
            return str(ref.get("uid") or "")
    return ""


def parse_pytorch_pod(obj: Mapping[str, Any]) -> PodView | None:
    """A pod the training-operator made for a PyTorchJob: its labels read as ours (role =
    replica type, rank = index = replica index), the job's uid from the controller
    reference; None for any other pod."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(LABEL_OPERATOR_NAME) != OPERATOR_NAME:
        return None
    role = str(labels.get(LABEL_REPLICA_TYPE, "")).lower()
    index = labels.get(LABEL_REPLICA_INDEX)
    job = labels.get(LABEL_JOB_NAME)
    if role not in REPLICA_TYPES or index is None or not job:
        return None
    ours = {
        LABEL_JOB: job,
        LABEL_JOB_UID: _owner_uid(meta),
        LABEL_ROLE: role,
        LABEL_RANK: index,
        LABEL_INDEX: index,
    }
    return parse_pod({**obj, "metadata": {**meta, "labels": ours}})


# -- plans -------------------------------------------------------------------------------


def _check_resizable(job: JobView, plan: ScalePlan) -> None:
    """Only the Worker role under an elasticPolicy changes size; say so before the bounds
    (min = max = replicas) say it less clearly."""
    for role, view in job.roles.items():
        group = plan.node_group_resources.get(role)
        resized = (group is not None and group.count and group.count != view.replicas) or any(
            n.type == role for n in [*plan.launch_nodes, *plan.remove_nodes]
        )
        if resized and view.elastic is None:
            why = "it has no elasticPolicy" if role == ELASTIC_ROLE else "only Worker is elastic"
            raise PlanRejected(
                f"PyTorchJob {job.name} cannot resize its {REPLICA_TYPES[role]} replicas: {why}"
            )


def _with_resources(template: Mapping[str, Any], resources: Resources) -> list[dict[str, Any]]:
    """The template's containers, the first asking for ``resources`` (requests = limits,
    as a TrainingJob's pods do; other resource names it asks for stay)."""
    containers = copy.deepcopy(list((template.get("spec") or {}).get("containers") or []))
    first = containers[0]
    quantities = resources_to_quantities(resources)
    current = first.get("resources") or {}
    first["resources"] = {
        **current,
        "requests": {**(current.get("requests") or {}), **quantities},
        "limits": {**(current.get("limits") or {}), **quantities},
    }
    return containers


def plan_change(job: JobView, pods: Sequence[PodView], plan: ScalePlan) -> PlanChange:
    """``plan`` as a change of the PyTorchJob; PlanRejected says why it cannot.

    The decisions a TrainingJob's plan gets (bounds, unknown roles, a finished job, the
    rendezvous host) are planning.plan_change's; this keeps what the training-operator
    can carry out and says no to the rest.
    """
    if plan.migrate_nodes:
        nodes = ", ".join(f"{m.node.type}-{m.node.id}" for m in plan.migrate_nodes)
        raise PlanRejected(
            f"cannot migrate {nodes}: a PyTorchJob's pods are the training-operator's, which "
            "applies a template change only to pods it creates later"
        )
    _check_resizable(job, plan)
    planned = planning.plan_change(job, pods, plan, CAPABILITIES)
    change = planned.change
    if change.node_resources:
        raise PlanRejected(
            "a PyTorchJob's replicas of one type share one pod template: a node cannot have "
            "resources of its own (change the role's resources instead)"
        )
    for ref in plan.remove_nodes:
        keep = change.replicas.get(ref.type, job.roles[ref.type].replicas)
        if ref.id < keep:
            raise PlanRejected(
                f"cannot remove {ref.type}-{ref.id}: the training-operator removes a "
                f"PyTorchJob's highest replica indexes, and {keep} replicas keep "
                f"{ref.type}-0..{keep - 1}"
            )
    notes = (LATER_PODS,) if change.resources else ()
    return PlanChange(change, planned.summary, notes=notes)


def job_patch(job: JobView, change: JobSpecChange) -> dict[str, Any]:
    """``change`` as one merge patch of the PyTorchJob: the replicas and the first
    container's resources of each replica type it changes, the plan ids in the same
    annotation as a TrainingJob's, on the version it was decided on.

    A change that gives a node resources of its own is refused (Invalid): the replicas of
    a type share one template, so it would be kept and never honoured. The ranks a change
    removes first are not written: the training-operator removes the highest indexes
    whatever a job says (``plan_change`` rejects a plan that names others)."""
    if any(change.node_resources.values()):
        raise Invalid(
            f"PyTorchJob {job.name}: the replicas of a type share one pod template, so no "
            "node can have resources of its own"
        )
    specs: dict[str, Any] = {}
    for role in job.roles:
        out: dict[str, Any] = {}
        if role in change.replicas:
            out["replicas"] = change.replicas[role]
        if role in change.resources:
            containers = _with_resources(job.roles[role].template, change.resources[role])
            out["template"] = {"spec": {"containers": containers}}
        if out:
            specs[REPLICA_TYPES[role]] = out
    patch: dict[str, Any] = {
        "metadata": {
            "resourceVersion": change.resource_version,
            "annotations": plans_annotation(change),
        }
    }
    spec: dict[str, Any] = {}
    if specs:
        spec["pytorchReplicaSpecs"] = specs
    if change.suspend is not None:
        spec["runPolicy"] = {"suspend": change.suspend}
    if spec:
        patch["spec"] = spec
    return patch


def plan_not_applied(plan: ScalePlan) -> tuple[NotApplied, ...]:
    return not_applied(plan, UNSUPPORTED)


class PyTorchJobAdapter(WorkloadAdapter):
    kind = KIND
    group = GROUP
    version = VERSION
    plural = PLURAL
    creates_pods = False

    def parse(self, obj: Mapping[str, Any]) -> JobView:
        return parse_pytorchjob(obj)

    def parse_pod(self, obj: Mapping[str, Any]) -> PodView | None:
        return parse_pytorch_pod(obj)

    def pod_selector(self) -> str:
        return f"{LABEL_OPERATOR_NAME}={OPERATOR_NAME},{LABEL_JOB_NAME}"

    def job_pod_selector(self, name: str) -> str:
        return f"{LABEL_OPERATOR_NAME}={OPERATOR_NAME},{LABEL_JOB_NAME}={name}"

    def outcome(self, job: JobView, pods: Sequence[PodView]) -> tuple[str | None, str]:
        return outcome(job)

    @property
    def capabilities(self) -> PlatformCapabilities:
        return CAPABILITIES

    def plan_not_applied(self, plan: ScalePlan) -> tuple[NotApplied, ...]:
        return plan_not_applied(plan)

    def plan_change(self, job: JobView, pods: Sequence[PodView], plan: ScalePlan) -> PlanChange:
        return plan_change(job, pods, plan)

    def job_patch(self, job: JobView, change: JobSpecChange) -> dict[str, Any]:
        return job_patch(job, change)

    def status_patch(self, status: OperatorJobStatus) -> dict[str, Any] | None:
        """None: the status is the training-operator's; the plan id is in the annotation."""
        return None


PYTORCH_JOB = PyTorchJobAdapter()

__all__ = [
    "CAPABILITIES",
    "GROUP",
    "KIND",
    "LABEL_JOB_NAME",
    "LABEL_OPERATOR_NAME",
    "LABEL_REPLICA_INDEX",
    "LABEL_REPLICA_TYPE",
    "OPERATOR_NAME",
    "PLURAL",
    "PYTORCH_JOB",
    "REPLICA_TYPES",
    "UNSUPPORTED",
    "VERSION",
    "PyTorchJobAdapter",
    "conditions_phase",
    "job_patch",
    "outcome",
    "parse_pytorch_pod",
    "parse_pytorchjob",
    "plan_change",
    "plan_not_applied",
]
