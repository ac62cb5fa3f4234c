"""The TrainingJob (deploy/crds/trainingjobs.yaml): the job document of both platforms.

A user writes one TrainingJob and submits it to Kubernetes or to the local platform alike
(`job submit`, the jobs API) and it is read here into the port's ``JobView``, at the
platform's edge. On Kubernetes the document is what the cluster keeps: what the reconciler
decides comes back as a ``JobSpecChange`` and an ``OperatorJobStatus``, written into it as
merge patches (RFC 7386, a custom resource's patch), the plan ids in the same patch as the
change they made, so a plan delivered again after a crash finds its change already made.
The local platform reads the document once, at submission, and keeps the typed job
(handlers.operator.platform.changes applies the same changes to it, held to this path by
tests/property/test_job_changes.py); ``render_job`` shows such a job as a document again.

Per-node state the schema has no field for lives in annotations of the job, as JSON:
the plans applied, the resources a plan gave one node, the ranks a plan removed by name,
who admitted or suspended the job (beside ``spec.suspend``, in the same patch). Its
resources are quantities ("500m", "16Gi"), read by ``quantity``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from handlers.operator.document.quantity import (
    GPU,
    GPU_TYPE,
    QuantityError,
    resources_from_container,
    resources_from_spec,
    resources_to_spec,
)
from handlers.operator.platform.bodies import (
    ADMITTED,
    DEFAULT_RENDEZVOUS_PORT,
    DOMAIN,
    ELASTIC_MODES,
    IDENTITY_LABELS,
    IN_PLACE,
    KUEUE_QUEUE_LABEL,
    MAX_SPARES,
    PRIORITY_LABEL,
    QUEUED,
    RESTART,
    SUSPENDED,
    SUSPENDED_CONDITION,
    ElasticPolicy,
    JobAdmission,
    JobBatch,
    JobCondition,
    JobSpecChange,
    JobView,
    OperatorJobStatus,
    Resources,
    RoleView,
    VolumeMount,
)
from handlers.operator.platform.errors import InvalidJob
from schemas.plan_parts import not_applied
from schemas.plans import NotApplied, ScalePlan

GROUP = DOMAIN
VERSION = "v1alpha1"
PLURAL = "trainingjobs"
KIND = "TrainingJob"
API_VERSION = f"{GROUP}/{VERSION}"

#: JSON list of the last plan ids applied to the job's spec, written in the same patch as
#: the spec change: a plan delivered again after a crash finds its change already made.
ANN_PLANS = f"{DOMAIN}/applied-plans"
#: JSON {role: {rank: resources}}: nodes that a plan migrated to other resources than the
#: role's (the schema has no per-node field, and pruning would drop one).
ANN_NODE_RESOURCES = f"{DOMAIN}/node-resources"
#: JSON {role: [rank, ...]}: ranks a plan removed by name; scaling down takes them first.
ANN_REMOVE_FIRST = f"{DOMAIN}/remove-first"
#: The directory a job's commands run in on the local platform (set by `job submit`:
#: where it was submitted).
ANN_WORKDIR = f"{DOMAIN}/workdir"
#: JSON {state, reason, message, plan}: who admitted or suspended the job last, and why
#: (platform.JobAdmission), written in the same patch as spec.suspend.
ANN_ADMISSION = f"{DOMAIN}/admission"

ROLE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")

_POD_ASKS = f"a TrainingJob's pods ask only for cpu, memory and {GPU}"

#: Resource fields a plan may set that a TrainingJob's pods cannot express. A GPU type
#: can be, as a node selector, where the platform knows the node label that names GPU
#: types (Kubernetes: DLROVER_EVENTS_OPERATOR_GPU_TYPE_LABEL); GPU memory never: a pod
#: asks for whole GPUs.
UNSUPPORTED = {
    "gpu_type": f"{_POD_ASKS}: no GPU type (the operator has no GPU type node label)",
    "gpu_memory": (
        f"{_POD_ASKS}: no GPU memory size (a pod cannot request GPU memory, only whole GPUs)"
    ),
    "priority": f"{_POD_ASKS}: no priority",
}


def unsupported(gpu_types: bool) -> dict[str, str]:
    """What a TrainingJob's pods cannot express where GPU types can (or cannot) be
    selected."""
    if gpu_types:
        return {k: v for k, v in UNSUPPORTED.items() if k != "gpu_type"}
    return dict(UNSUPPORTED)


def plan_not_applied(
    plan: ScalePlan, gpu_types: bool = False, only_host: str | None = None
) -> tuple[NotApplied, ...]:
    """The parts of ``plan`` no TrainingJob change applies, whatever the job: a function
    of the plan (and whether GPU types are selected, and the platform's one host if it
    has one) alone, so a plan finished after a restart is answered the same way. On a
    platform of one host (``only_host``) a placement that names only it is what happens
    anyway: applied."""
    pinned = only_host is not None and set(plan.placement) <= {only_host}
    return not_applied(plan, unsupported(gpu_types), pins_nodes=pinned)


# -- document -> JobView --------------------------------------------------------------------


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


_PRIORITY = re.compile(r"^-?[0-9]{1,10}\Z")
_GROUP = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,252}\Z")
_QUEUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?\Z")


def check_sharing_labels(labels: Mapping[str, Any]) -> None:
    """The labels a cluster scheduler reads (priority, group or user, Kueue's queue) must
    say what its job.submitted can carry; InvalidJob names the label and the rule."""
    priority = labels.get(PRIORITY_LABEL)
    if priority is not None:
        text = str(priority)
        if not _PRIORITY.match(text) or not -(2**31) <= int(text) <= 2**31 - 1:
            raise InvalidJob(
                f"label {PRIORITY_LABEL}={text!r} must be an integer from -2147483648 to "
                "2147483647 (higher is admitted first)"
            )
    for attr in ("group", "user"):
        value = labels.get(IDENTITY_LABELS[attr])
        if value and not _GROUP.match(str(value)):
            raise InvalidJob(
                f"label {IDENTITY_LABELS[attr]}={value!r}: a {attr} is letters, digits and "
                "'._@-', starting with a letter or digit"
            )
    queue = labels.get(KUEUE_QUEUE_LABEL)
    if queue is not None and not _QUEUE.match(str(queue)):
        raise InvalidJob(f"label {KUEUE_QUEUE_LABEL}={queue!r} is not a queue name")


def parse_admission(meta: Mapping[str, Any]) -> JobAdmission | None:
    """Who admitted or suspended the job last (ANN_ADMISSION), None when no one did."""
    raw = _annotation(meta, ANN_ADMISSION, None)
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or raw.get("state") not in (QUEUED, ADMITTED, SUSPENDED):
        raise InvalidJob(
            f"annotation {ANN_ADMISSION} must say a state: queued, admitted or suspended"
        )
    plan = raw.get("plan")
    return JobAdmission(
        state=str(raw["state"]),
        reason=str(raw.get("reason") or ""),
        message=str(raw.get("message") or ""),
        plan_id=str(plan) if plan else None,
    )


def admission_annotation(admission: JobAdmission) -> dict[str, str]:
    body = {
        "state": admission.state,
        "reason": admission.reason,
        "message": admission.message,
        "plan": admission.plan_id,
    }
    return {ANN_ADMISSION: json.dumps(body, sort_keys=True)}


def object_fields(meta: Mapping[str, Any]) -> dict[str, Any]:
    """What a JobView of any kind takes from its object's metadata: who it is, and who
    admitted or suspended it."""
    labels = dict(meta.get("labels") or {})
    check_sharing_labels(labels)
    return {
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", ""),
        "uid": meta.get("uid", ""),
        "resource_version": str(meta.get("resourceVersion", "")),
        "generation": int(meta.get("generation") or 0),
        "labels": labels,
        "admission": parse_admission(meta),
    }


def training_container(
    containers: Sequence[Mapping[str, Any]], container: str | None
) -> Mapping[str, Any]:
    """The role's container (its ``container``, else the first; {} when there is none)."""
    if container is not None:
        for c in containers:
            if c.get("name") == container:
                return c
    return containers[0] if containers else {}


def _template_fields(template: Mapping[str, Any], container: str | None) -> dict[str, Any]:
    """What a platform that runs no container takes from a role's pod template: the
    training container's command and args, the plain variables of every container, the
    grace period, and what the container asks for by itself."""
    spec = template.get("spec") or {}
    containers = spec.get("containers") or []
    chosen = training_container(containers, container)
    env: dict[str, str] = {}
    for c in containers:
        for var in c.get("env") or []:
            if "value" in var:
                env[str(var["name"])] = str(var["value"])
    grace = spec.get("terminationGracePeriodSeconds")
    try:
        asked = resources_from_container(chosen)
    except QuantityError:
        asked = Resources()  # the platform refuses such a pod itself
    return {
        "command": (*(chosen.get("command") or []), *(chosen.get("args") or [])),
        "env": env,
        "grace_s": grace if isinstance(grace, int) and not isinstance(grace, bool) else None,
        "template_resources": asked,
    }


def parse_condition(raw: Any, kind: str) -> JobCondition | None:
    """The status's condition of type ``kind`` (None: it has none)."""
    for cond in raw.get("conditions") or [] if isinstance(raw, Mapping) else []:
        if isinstance(cond, Mapping) and cond.get("type") == kind:
            return JobCondition(
                type=kind,
                status=cond.get("status") == "True",
                reason=str(cond.get("reason") or ""),
                message=str(cond.get("message") or ""),
                since=cond.get("lastTransitionTime"),
            )
    return None


def parse_status(raw: Any) -> OperatorJobStatus | None:
    """What the operator wrote on the job's status (None: nothing yet)."""
    if not isinstance(raw, Mapping) or not raw:
        return None
    generation = raw.get("observedGeneration")
    return OperatorJobStatus(
        phase=str(raw.get("phase") or ""),
        roles=dict(raw.get("roles") or {}),
        observed_generation=generation if isinstance(generation, int) else None,
        last_plan_id=raw.get("lastPlanId"),
        last_plan_time=raw.get("lastPlanTime"),
        suspended=parse_condition(raw, SUSPENDED_CONDITION),
    )


def parse_job(obj: Mapping[str, Any]) -> JobView:
    """A TrainingJob as the decisions see it; InvalidJob names what the schema let through."""
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
            resources = resources_from_spec(role.get("resources"))
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
            port=_port(name, role.get("port")),
            start_after=_role_names(name, "startAfter", role.get("startAfter")),
            scales=_role_names(name, "scales", role.get("scales")),
            volumes=_mounts(name, role.get("volumes")),
            **_template_fields(template, container),
        )
    if not roles:
        raise InvalidJob("the job has no roles")
    volumes = _volumes(spec.get("volumes"))
    _check_relations(roles, volumes)
    success_roles = _success_roles(spec.get("successPolicy"), roles)
    overrides = _annotation(meta, ANN_NODE_RESOURCES, {})
    try:
        node_resources = {
            role: {rank: resources_from_spec(res) for rank, res in _int_keys(ranks).items()}
            for role, ranks in overrides.items()
        }
        remove_first = {
            role: tuple(int(r) for r in ranks)
            for role, ranks in _annotation(meta, ANN_REMOVE_FIRST, {}).items()
        }
    except (AttributeError, TypeError, ValueError) as e:
        raise InvalidJob(f"per-node annotations: {e}") from None
    suspend = spec.get("suspend", False)
    if not isinstance(suspend, bool):
        raise InvalidJob("spec.suspend must be true or false")
    batch = _batch(spec.get("batch"))
    return JobView(
        **object_fields(meta),
        roles=roles,
        node_resources=node_resources,
        remove_first=remove_first,
        applied_plans=tuple(_annotation(meta, ANN_PLANS, [])),
        phase=status.get("phase"),
        last_plan_id=status.get("lastPlanId"),
        status=parse_status(status),
        success_roles=success_roles,
        suspended=suspend,
        batch=batch,
        volumes=volumes,
        document=obj,
    )


#: The fields of a TrainingJob's spec and of a role (deploy/crds/trainingjobs.yaml): any
#: other is refused at submission, since the API server's schema would drop it silently.
SPEC_FIELDS = ("roles", "suspend", "batch", "successPolicy", "volumes")
ROLE_FIELDS = (
    "replicas",
    "minReplicas",
    "maxReplicas",
    "container",
    "resources",
    "elastic",
    "restartPolicy",
    "template",
    "port",
    "startAfter",
    "scales",
    "volumes",
)


def unknown_fields(spec: Any) -> list[str]:
    """The fields of ``spec`` (and of its roles) a TrainingJob does not have, by path."""
    if not isinstance(spec, Mapping):
        return []
    out = [f"spec.{k}" for k in spec if k not in SPEC_FIELDS]
    roles = spec.get("roles")
    for name, role in (roles or {}).items() if isinstance(roles, Mapping) else ():
        if isinstance(role, Mapping):
            out.extend(f"spec.roles.{name}.{k}" for k in role if k not in ROLE_FIELDS)
    return out


_VOLUME_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")


def _port(role: str, raw: Any) -> int | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= 65535:
        raise InvalidJob(f"role {role}: port must be a whole number in 1..65535, got {raw!r}")
    return raw


def _role_names(role: str, key: str, raw: Any) -> tuple[str, ...]:
    """A role's list of other roles (``startAfter``, ``scales``); whether they exist is
    checked once every role is read."""
    if raw is None:
        return ()
    if not isinstance(raw, (list, tuple)) or not all(isinstance(r, str) for r in raw):
        raise InvalidJob(f"role {role}: {key} must be a list of role names")
    if role in raw:
        raise InvalidJob(f"role {role}: {key} names the role itself")
    return tuple(dict.fromkeys(raw))


def _mounts(role: str, raw: Any) -> tuple[VolumeMount, ...]:
    """``roles.<r>.volumes``: the job volumes the role mounts, each once, at an absolute
    path of its own."""
    if raw is None:
        return ()
    if not isinstance(raw, (list, tuple)):
        raise InvalidJob(f"role {role}: volumes must be a list of {{name, mountPath}}")
    out: list[VolumeMount] = []
    for item in raw:
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise InvalidJob(f"role {role}: each of its volumes needs a name")
        path = item.get("mountPath")
        if not isinstance(path, str) or not path.startswith("/"):
            raise InvalidJob(
                f"role {role}: volume {item['name']}: mountPath must be an absolute path, "
                f"got {path!r}"
            )
        read_only = item.get("readOnly", False)
        if not isinstance(read_only, bool):
            raise InvalidJob(f"role {role}: volume {item['name']}: readOnly must be a boolean")
        out.append(VolumeMount(item["name"], path.rstrip("/") or "/", read_only))
    names = [m.name for m in out]
    paths = [m.mount_path for m in out]
    if len(set(names)) != len(names) or len(set(paths)) != len(paths):
        raise InvalidJob(f"role {role}: a volume is mounted twice, or two at one path")
    return tuple(out)


def _volumes(raw: Any) -> dict[str, dict[str, Any]]:
    """``spec.volumes``: Kubernetes volumes (a name and one source), by name."""
    if raw is None:
        return {}
    if not isinstance(raw, (list, tuple)):
        raise InvalidJob("spec.volumes must be a list of volumes ({name, <source>})")
    out: dict[str, dict[str, Any]] = {}
    for item in raw:
        name = item.get("name") if isinstance(item, Mapping) else None
        if not isinstance(name, str) or not _VOLUME_NAME.match(name):
            raise InvalidJob(f"spec.volumes: {name!r} is no volume name (a DNS label)")
        if name in out:
            raise InvalidJob(f"spec.volumes: volume {name} is given twice")
        sources = [k for k in item if k != "name"]
        if len(sources) != 1 or not isinstance(item[sources[0]], Mapping):
            raise InvalidJob(
                f"spec.volumes: volume {name} must have exactly one source (hostPath, "
                f"emptyDir, persistentVolumeClaim, ...), got {', '.join(sources) or 'none'}"
            )
        out[name] = json.loads(json.dumps(dict(item)))
    return out


def _check_relations(roles: Mapping[str, RoleView], volumes: Mapping[str, Any]) -> None:
    """What one role says of others and of the job's volumes: roles that exist, an order
    without a cycle, bounds for every role another may scale, volumes the job has."""
    for role in roles.values():
        for key, named in (("startAfter", role.start_after), ("scales", role.scales)):
            unknown = [r for r in named if r not in roles]
            if unknown:
                raise InvalidJob(
                    f"role {role.name}: {key} names role(s) {', '.join(unknown)} the job "
                    f"does not have (roles: {', '.join(roles)})"
                )
        for target in role.scales:
            if roles[target].max_replicas is None:
                raise InvalidJob(
                    f"role {role.name} scales {target}, which declares no maxReplicas: a "
                    "role scaled by another needs its bounds"
                )
        missing = [m.name for m in role.volumes if m.name not in volumes]
        if missing:
            raise InvalidJob(
                f"role {role.name}: volume(s) {', '.join(missing)} not in spec.volumes "
                f"(volumes: {', '.join(volumes) or 'none'})"
            )
    # startAfter must leave an order: a depth-first walk finds any cycle
    state: dict[str, int] = {}

    def walk(name: str, path: tuple[str, ...]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = " -> ".join((*path[path.index(name) :], name))
            raise InvalidJob(f"startAfter makes a cycle: {cycle}")
        state[name] = 1
        for before in roles[name].start_after:
            walk(before, (*path, name))
        state[name] = 2

    for name in roles:
        walk(name, ())


#: spec.batch's fields, as JobBatch names them.
_BATCH_FIELDS = {
    "size": "size",
    "minSize": "min_size",
    "maxSize": "max_size",
    "minLocal": "min_local",
    "maxLocal": "max_local",
}


def _batch(raw: Any) -> JobBatch | None:
    """spec.batch, with the order the schema cannot check (min <= size <= max, a local
    range in order); None when the job says no batch."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise InvalidJob("spec.batch must be an object")
    numbers: dict[str, int | None] = {}
    for key, attr in _BATCH_FIELDS.items():
        value = raw.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise InvalidJob(f"spec.batch.{key} must be a whole number")
        if value is not None and not 1 <= value <= 2**40:
            raise InvalidJob(f"spec.batch.{key} must be within [1, 2^40], got {value}")
        numbers[attr] = value
    size = numbers.pop("size")
    if size is None:
        raise InvalidJob("spec.batch.size is required: the global batch the job starts with")
    adaptive = raw.get("adaptive", False)
    if not isinstance(adaptive, bool):
        raise InvalidJob("spec.batch.adaptive must be true or false")
    low, high = numbers["min_size"], numbers["max_size"]
    if (low is not None and low > size) or (high is not None and high < size):
        raise InvalidJob(f"spec.batch: minSize <= size <= maxSize, got {low} <= {size} <= {high}")
    local_low, local_high = numbers["min_local"], numbers["max_local"]
    if local_low is not None and local_high is not None and local_low > local_high:
        raise InvalidJob(f"spec.batch: minLocal {local_low} > maxLocal {local_high}")
    return JobBatch(size=size, adaptive=adaptive, **numbers)


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


# -- JobSpecChange, OperatorJobStatus -> merge patches ------------------------------------


def plans_annotation(change: JobSpecChange) -> dict[str, str]:
    """The applied plans, and who admits or suspends the job when the change says it, as
    every kind of job records them (a PyTorchJob too)."""
    out = {ANN_PLANS: json.dumps(list(change.applied_plans))}
    if change.admission is not None:
        out.update(admission_annotation(change.admission))
    return out


def job_patch(job: JobView, change: JobSpecChange) -> dict[str, Any]:
    """``change`` as one merge patch of the TrainingJob: the plan ids, per-node resources
    and removals in annotations, replicas and role resources in the spec, and the version
    it was decided on (a write on any other version is a conflict)."""
    node_res = {
        role: {str(rank): resources_to_spec(res) for rank, res in sorted(ranks.items())}
        for role, ranks in sorted(change.node_resources.items())
        if ranks
    }
    removed = {role: list(ranks) for role, ranks in sorted(change.remove_first.items())}
    annotations = {
        **plans_annotation(change),
        ANN_NODE_RESOURCES: json.dumps(node_res, sort_keys=True),
        ANN_REMOVE_FIRST: json.dumps(removed, sort_keys=True),
    }
    patch: dict[str, Any] = {
        "metadata": {"resourceVersion": change.resource_version, "annotations": annotations}
    }
    roles: dict[str, Any] = {}
    for role in job.roles:
        entry: dict[str, Any] = {}
        if role in change.replicas:
            entry["replicas"] = change.replicas[role]
        if role in change.resources:
            entry["resources"] = resources_to_spec(change.resources[role])
        if entry:
            roles[role] = entry
    spec: dict[str, Any] = {}
    if roles:
        spec["roles"] = roles
    if change.suspend is not None:
        spec["suspend"] = change.suspend
    if spec:
        patch["spec"] = spec
    return patch


def condition_body(cond: JobCondition) -> dict[str, Any]:
    """A condition as Kubernetes writes it."""
    body = {
        "type": cond.type,
        "status": "True" if cond.status else "False",
        "reason": cond.reason,
        "message": cond.message,
    }
    if cond.since is not None:
        body["lastTransitionTime"] = cond.since
    return body


def status_patch(status: OperatorJobStatus) -> dict[str, Any]:
    """The status subresource's merge patch that says ``status`` (a merge patch replaces
    a list whole: the conditions are the operator's only)."""
    out: dict[str, Any] = {
        "phase": status.phase,
        "roles": {role: dict(counts) for role, counts in status.roles.items()},
        "observedGeneration": status.observed_generation,
    }
    if status.last_plan_id is not None:
        out["lastPlanId"] = status.last_plan_id
    if status.last_plan_time is not None:
        out["lastPlanTime"] = status.last_plan_time
    if status.suspended is not None:
        out["conditions"] = [condition_body(status.suspended)]
    return {"status": out}


# -- JobView -> document, to show it ----------------------------------------------------

_SPEC_RESOURCES = ("cpu", "memory", GPU, GPU_TYPE)


def render_job(job: JobView, submitted: Mapping[str, Any]) -> dict[str, Any]:
    """The TrainingJob document that says ``job`` as it is now, on the document its user
    submitted: for a platform that keeps its jobs as values (the local platform), where a
    door shows a job as a document (`job describe --json`, the jobs API). No decision
    reads it, so it is made only when a door asks."""
    doc: dict[str, Any] = json.loads(json.dumps(submitted))
    meta = doc.setdefault("metadata", {})
    meta.update(
        name=job.name,
        namespace=job.namespace,
        uid=job.uid,
        resourceVersion=job.resource_version,
        generation=job.generation,
    )
    annotations = dict(meta.get("annotations") or {})
    said = {
        ANN_PLANS: list(job.applied_plans),
        ANN_NODE_RESOURCES: {
            role: {str(rank): resources_to_spec(res) for rank, res in sorted(ranks.items())}
            for role, ranks in sorted(job.node_resources.items())
        },
        ANN_REMOVE_FIRST: {role: list(ranks) for role, ranks in sorted(job.remove_first.items())},
    }
    for key, value in said.items():
        if value:
            annotations[key] = json.dumps(value, sort_keys=True)
        else:
            annotations.pop(key, None)
    annotations.pop(ANN_ADMISSION, None)
    if job.admission is not None:
        annotations.update(admission_annotation(job.admission))
    meta["annotations"] = annotations
    spec = doc.setdefault("spec", {})
    spec_roles = spec.setdefault("roles", {})
    for name, role in job.roles.items():
        entry = spec_roles.setdefault(name, {})
        others = {
            k: v for k, v in (entry.get("resources") or {}).items() if k not in _SPEC_RESOURCES
        }
        entry["replicas"] = role.replicas
        entry["resources"] = {**others, **resources_to_spec(role.resources)}
    if job.suspended or "suspend" in spec:
        spec["suspend"] = job.suspended
    doc.pop("status", None)
    if job.status is not None:
        status = status_patch(job.status)["status"]
        doc["status"] = {k: v for k, v in status.items() if v is not None}
    return doc


__all__ = [
    "ANN_ADMISSION",
    "ANN_NODE_RESOURCES",
    "ANN_PLANS",
    "ANN_REMOVE_FIRST",
    "ANN_WORKDIR",
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "ROLE_FIELDS",
    "ROLE_NAME",
    "SPEC_FIELDS",
    "UNSUPPORTED",
    "VERSION",
    "admission_annotation",
    "check_sharing_labels",
    "condition_body",
    "job_patch",
    "object_fields",
    "parse_admission",
    "parse_condition",
    "parse_job",
    "parse_status",
    "plan_not_applied",
    "plans_annotation",
    "render_job",
    "status_patch",
    "training_container",
    "unknown_fields",
    "unsupported",
]
