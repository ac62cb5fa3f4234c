"""A change and a status applied to a typed job (platform.changes, the local platform's
path) give the same JobView as Kubernetes' path: the change as a TrainingJob merge patch
(document.trainingjob.job_patch, status_patch), merged into the job's document (RFC 7386)
and the document read back (parse_job). Jobs are generated as documents, in every spelling
a user may write their quantities ("500m", "0.5", 1, "1Gi"), with per-node annotations,
admissions and statuses; changes and statuses are generated against them, in chains, so
that what one write leaves is what the next one meets."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from handlers.operator.document.quantity import GPU, GPU_TYPE
from handlers.operator.document.trainingjob import (
    ANN_ADMISSION,
    ANN_NODE_RESOURCES,
    ANN_PLANS,
    ANN_REMOVE_FIRST,
    ANN_WORKDIR,
    job_patch,
    parse_job,
    render_job,
    status_patch,
)
from handlers.operator.platform.bodies import (
    ADMITTED,
    QUEUED,
    SUSPENDED,
    SUSPENDED_CONDITION,
    JobAdmission,
    JobCondition,
    JobSpecChange,
    JobView,
    OperatorJobStatus,
    Resources,
)
from handlers.operator.platform.changes import apply_change, apply_status

ROLES = ("worker", "ps", "chief")
#: a role no job here has: a change may name it, and both paths ignore it
GHOST = "ghost"
words = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=12)
times = st.sampled_from(["2026-01-01T00:00:00Z", "2026-11-29T08:00:00Z"])
plan_ids = st.sampled_from(["p-1", "p-2", "suspend-1", "resume-1"])

# -- a job as its user writes it -------------------------------------------------------

milli = st.integers(0, 10**7)
cpu_spellings = st.one_of(
    st.integers(0, 64),
    milli.map(lambda m: f"{m}m"),
    milli.map(lambda m: str(Decimal(m) / 1000)),
)
memory_spellings = st.one_of(
    st.integers(0, 2**40),
    st.integers(0, 512).map(lambda n: f"{n}Gi"),
    st.integers(0, 10**6).map(lambda n: f"{n}Mi"),
    st.integers(0, 10**6).map(lambda n: f"{n}k"),
)
gpu_types = st.sampled_from(["", "A100", "H100"])


@st.composite
def resource_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A role's (or a node's) resources as a document writes them, maybe with a resource
    no decision reads (a merge keeps it, a read ignores it)."""
    out: dict[str, Any] = {}
    for key, values in (
        ("cpu", cpu_spellings),
        ("memory", memory_spellings),
        (GPU, st.one_of(st.integers(0, 8), st.integers(0, 8).map(str))),
        (GPU_TYPE, gpu_types),
        ("ephemeral-storage", st.just("1Gi")),
    ):
        if draw(st.booleans()):
            out[key] = draw(values)
    return out


@st.composite
def roles(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(ROLES), min_size=1, max_size=3, unique=True))
    out = {}
    for name in names:
        role: dict[str, Any] = {
            "replicas": draw(st.integers(0, 8)),
            "template": {"spec": {"containers": [{"name": "main", "command": ["true"]}]}},
        }
        if draw(st.booleans()):
            role["resources"] = draw(resource_specs())
        if draw(st.booleans()):
            role["minReplicas"], role["maxReplicas"] = 1, 8
        if draw(st.booleans()):
            role["elastic"] = draw(
                st.sampled_from([{"mode": "restart"}, {"mode": "inPlace", "spares": 1}])
            )
        out[name] = role
    return out


admissions = st.builds(
    JobAdmission,
    state=st.sampled_from([QUEUED, ADMITTED, SUSPENDED]),
    reason=st.sampled_from(["", "Queued", "Admitted", "Resumed", "Preempted"]),
    message=words,
    plan_id=st.one_of(st.none(), st.just(""), plan_ids),
)
conditions = st.builds(
    JobCondition,
    type=st.just(SUSPENDED_CONDITION),
    status=st.booleans(),
    reason=st.sampled_from(["", "Queued", "Admitted", "Preempted"]),
    message=words,
    since=st.one_of(st.none(), times),
)
counts = st.dictionaries(
    st.sampled_from(["pending", "running", "succeeded", "failed"]), st.integers(0, 8)
)
statuses = st.builds(
    OperatorJobStatus,
    phase=st.sampled_from(["Pending", "Running", "Scaling", "Suspended", "Succeeded"]),
    roles=st.dictionaries(st.sampled_from([*ROLES, GHOST]), counts, max_size=3),
    observed_generation=st.one_of(st.none(), st.integers(0, 50)),
    last_plan_id=st.one_of(st.none(), plan_ids),
    last_plan_time=st.one_of(st.none(), times),
    suspended=st.one_of(st.none(), conditions),
)


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    """A TrainingJob as a store holds it: what its user wrote, what earlier plans wrote
    in its annotations, and maybe a status."""
    spec_roles = draw(roles())
    annotations: dict[str, str] = {ANN_WORKDIR: "/tmp"}
    if draw(st.booleans()):
        annotations[ANN_PLANS] = json.dumps(draw(st.lists(plan_ids, max_size=3)))
    if draw(st.booleans()):
        nodes = {
            role: {str(rank): draw(resource_specs()) for rank in draw(st.sets(st.integers(0, 4)))}
            for role in draw(st.sets(st.sampled_from(list(spec_roles))))
        }
        annotations[ANN_NODE_RESOURCES] = json.dumps(nodes)
    if draw(st.booleans()):
        removed = {role: draw(st.lists(st.integers(0, 8), max_size=3)) for role in spec_roles}
        annotations[ANN_REMOVE_FIRST] = json.dumps(removed)
    admission = draw(st.one_of(st.none(), admissions))
    if admission is not None:
        body = {
            "state": admission.state,
            "reason": admission.reason,
            "message": admission.message,
            "plan": admission.plan_id,
        }
        annotations[ANN_ADMISSION] = json.dumps(body)
    spec: dict[str, Any] = {"roles": spec_roles}
    if draw(st.booleans()):
        spec["suspend"] = draw(st.booleans())
    doc: dict[str, Any] = {
        "apiVersion": "dlrover-events.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {
            "name": "j",
            "namespace": "default",
            "uid": "u-1",
            "resourceVersion": "7",
            "generation": 3,
            "annotations": annotations,
        },
        "spec": spec,
    }
    status = draw(st.one_of(st.none(), statuses))
    if status is not None:
        doc["status"] = status_patch(status)["status"]
        if draw(st.booleans()):  # a condition of someone else's beside the operator's
            doc["status"].setdefault("conditions", []).append(
                {"type": "Other", "status": "True", "reason": "X", "message": ""}
            )
    return doc


# -- what the reconciler writes on it ----------------------------------------------------

resources = st.builds(
    Resources,
    cpu_milli=st.one_of(st.none(), milli),
    memory=st.one_of(st.none(), st.integers(0, 2**50)),
    gpu=st.one_of(st.none(), st.integers(0, 16)),
    gpu_type=st.one_of(st.none(), gpu_types),
)


@st.composite
def changes(draw: st.DrawFn, job: JobView) -> JobSpecChange:
    """A change decided on ``job``'s version (a store writes no other)."""
    names = st.sampled_from([*job.roles, GHOST])
    return JobSpecChange(
        resource_version=job.resource_version,
        applied_plans=tuple(draw(st.lists(plan_ids, max_size=4))),
        replicas=draw(st.dictionaries(names, st.integers(0, 16), max_size=3)),
        resources=draw(st.dictionaries(names, resources, max_size=3)),
        node_resources=draw(
            st.dictionaries(
                names, st.dictionaries(st.integers(0, 8), resources, max_size=3), max_size=3
            )
        ),
        remove_first=draw(
            st.dictionaries(names, st.lists(st.integers(0, 8), max_size=3).map(tuple), max_size=3)
        ),
        suspend=draw(st.one_of(st.none(), st.booleans())),
        admission=draw(st.one_of(st.none(), admissions)),
    )


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server merges a custom resource's patch: objects merge key by
    key, null deletes, the rest replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def read_back(doc: dict[str, Any]) -> JobView:
    """Kubernetes' path: what a read of the patched document gives."""
    return parse_job(doc)


@settings(max_examples=120, deadline=None)
@given(documents(), st.data())
def test_a_change_applied_is_the_patch_merged_and_read(
    doc: dict[str, Any], data: st.DataObject
) -> None:
    view = parse_job(doc)
    change = data.draw(changes(view))

    typed = apply_change(view, change)

    assert typed == read_back(merge_patch(doc, job_patch(view, change)))


@settings(max_examples=120, deadline=None)
@given(documents(), statuses)
def test_a_status_said_is_the_status_patch_merged_and_read(
    doc: dict[str, Any], status: OperatorJobStatus
) -> None:
    view = parse_job(doc)

    typed = apply_status(view, status)

    assert typed == read_back(merge_patch(doc, status_patch(status)))


@settings(max_examples=60, deadline=None)
@given(documents(), st.data())
def test_chains_of_writes_stay_the_same_on_both_paths(
    doc: dict[str, Any], data: st.DataObject
) -> None:
    """Changes and statuses one after another: each meets what the last one left (a
    role's merged counts, a condition kept, a role's resources merged twice)."""
    typed = parse_job(doc)
    for _ in range(data.draw(st.integers(1, 5))):
        if data.draw(st.booleans()):
            change = data.draw(changes(typed))
            doc = merge_patch(doc, job_patch(typed, change))
            typed = apply_change(typed, change)
        else:
            status = data.draw(statuses)
            doc = merge_patch(doc, status_patch(status))
            typed = apply_status(typed, status)
        assert typed == read_back(doc)


@settings(max_examples=60, deadline=None)
@given(documents(), st.data())
def test_a_job_shown_as_a_document_reads_back_as_itself(
    doc: dict[str, Any], data: st.DataObject
) -> None:
    """What a door shows of a typed job (render_job on the document as submitted) is a
    document that says that job: read, it is the job again."""
    submitted = {k: v for k, v in doc.items() if k != "status"}
    typed = parse_job(doc)
    for _ in range(data.draw(st.integers(0, 3))):
        if data.draw(st.booleans()):
            typed = apply_change(typed, data.draw(changes(typed)))
        else:
            typed = apply_status(typed, data.draw(statuses))

    assert parse_job(render_job(typed, submitted)) == typed
