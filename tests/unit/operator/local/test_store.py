"""The local platform's job store: typed jobs written as numbers, versioned (a stale write
is a Conflict, a spec change a new generation), shown to the doors as a document, and a
data dir written by the store before the typed records (a TrainingJob document per job)
read after an upgrade."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from handlers.operator.document.trainingjob import (
    ANN_ADMISSION,
    ANN_NODE_RESOURCES,
    ANN_PLANS,
    ANN_REMOVE_FIRST,
    ANN_WORKDIR,
)
from handlers.operator.local.cluster import LocalCluster
from handlers.operator.local.store import FORMAT, JobStore
from handlers.operator.platform.bodies import (
    SUSPENDED,
    JobAdmission,
    JobCondition,
    JobSpecChange,
    JobView,
    OperatorJobStatus,
    Resources,
    UnreadableJob,
)
from handlers.operator.platform.errors import Conflict, Invalid, ObjectNotFound

GiB = 2**30


def _document(name: str = "j") -> dict[str, Any]:
    return {
        "apiVersion": "dlrover-events.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "annotations": {ANN_WORKDIR: "/where/submitted"}},
        "spec": {
            "roles": {
                "worker": {
                    "replicas": 2,
                    "resources": {"cpu": "500m", "memory": "1Gi", "ephemeral-storage": "1Gi"},
                    "template": {"spec": {"containers": [{"name": "main", "command": ["true"]}]}},
                }
            }
        },
    }


def _job(entry: object) -> JobView:
    assert isinstance(entry, JobView), entry
    return entry


def _record(store: JobStore, name: str = "j") -> dict[str, Any]:
    got: dict[str, Any] = json.loads((store.jobs_dir / f"{name}.json").read_text())
    return got


def _strings(value: Any) -> list[str]:
    """Every string in a JSON value, keys aside."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def test_a_submitted_job_is_read_once_and_kept_in_numbers(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    made = store.create(_document())
    assert made.roles["worker"].resources == Resources(cpu_milli=500, memory=GiB)
    assert (made.generation, made.namespace) == (1, "default")

    record = _record(store)
    assert record["format"] == FORMAT
    assert record["job"]["roles"]["worker"]["resources"] == {
        "cpu_milli": 500,
        "memory": GiB,
        "gpu": None,
        "gpu_type": None,
    }
    assert record["document"]["spec"] == _document()["spec"]  # as its user wrote it
    assert _job(store.get("j")) == made


def test_a_change_is_written_as_numbers_in_one_write(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    made = store.create(_document())
    change = JobSpecChange(
        resource_version=made.resource_version,
        applied_plans=("p-1",),
        replicas={"worker": 3},
        resources={"worker": Resources(cpu_milli=1500)},
        node_resources={"worker": {2: Resources(cpu_milli=2000, memory=4 * GiB)}},
        remove_first={"worker": (1,)},
    )

    changed = store.change("j", change)

    assert _job(store.get("j")) == changed
    worker = changed.roles["worker"]
    assert (worker.replicas, worker.resources) == (3, Resources(cpu_milli=1500, memory=GiB))
    assert changed.node_resources == {"worker": {2: Resources(cpu_milli=2000, memory=4 * GiB)}}
    assert (changed.remove_first, changed.applied_plans) == ({"worker": (1,)}, ("p-1",))
    assert changed.generation == 2
    assert int(changed.resource_version) > int(made.resource_version)
    typed = _record(store)["job"]
    # numbers only: no quantity string was written for the change (the strings left are
    # names, policies, the template's command and the version)
    quantities = [s for s in _strings(typed) if re.fullmatch(r"[0-9.]+[a-zA-Z]*", s)]
    assert quantities == [typed["resource_version"]]
    assert typed["node_resources"] == {
        "worker": {"2": {"cpu_milli": 2000, "memory": 4 * GiB, "gpu": None, "gpu_type": None}}
    }


def test_a_stale_change_is_a_conflict_and_changes_nothing(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    made = store.create(_document())
    first = store.change("j", JobSpecChange(made.resource_version, ("a",), replicas={"worker": 3}))
    before = _record(store)

    with pytest.raises(Conflict):
        store.change("j", JobSpecChange(made.resource_version, ("b",), replicas={"worker": 1}))

    assert _record(store) == before
    assert _job(store.get("j")) == first
    with pytest.raises(ObjectNotFound):
        store.change("gone", JobSpecChange("", ("c",)))


def test_the_generation_moves_with_the_spec_only(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    made = store.create(_document())
    per_node = store.change(
        "j",
        JobSpecChange(
            made.resource_version, ("a",), node_resources={"worker": {0: Resources(gpu=1)}}
        ),
    )
    assert per_node.generation == 1  # the per-node state is no spec (annotations there)
    same = store.change(
        "j", JobSpecChange(per_node.resource_version, ("a", "b"), replicas={"worker": 2})
    )
    assert same.generation == 1  # the replicas it has already
    stop = JobAdmission(SUSPENDED, "Preempted", "by a plan", "c")
    suspended = store.change(
        "j", JobSpecChange(same.resource_version, ("a", "b", "c"), suspend=True, admission=stop)
    )
    assert (suspended.generation, suspended.suspended, suspended.admission) == (2, True, stop)


def test_a_status_is_said_on_any_version_and_leaves_the_spec(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    made = store.create(_document())
    status = OperatorJobStatus(
        phase="Running",
        roles={"worker": {"running": 2, "pending": 0}},
        observed_generation=1,
        last_plan_id="p-1",
        last_plan_time="2026-01-01T00:00:00Z",
        suspended=JobCondition("Suspended", False, "Admitted", "ok", "2026-01-01T00:00:00Z"),
    )
    said = store.set_status("j", status)
    assert said.status == status and said.phase == "Running" and said.last_plan_id == "p-1"
    assert (said.roles, said.generation) == (made.roles, made.generation)
    # a later status that leaves the last plan and the condition unsaid keeps them
    later = store.set_status(
        "j", OperatorJobStatus("Scaling", {"worker": {"pending": 1}}, observed_generation=1)
    )
    assert later.status is not None
    assert later.status.roles == {"worker": {"running": 2, "pending": 1}}
    assert (later.status.last_plan_id, later.status.suspended) == ("p-1", status.suspended)


def test_the_doors_see_the_job_as_a_document(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    made = store.create(_document())
    changed = store.change(
        "j",
        JobSpecChange(
            made.resource_version,
            ("p-1",),
            replicas={"worker": 3},
            resources={"worker": Resources(cpu_milli=1500)},
            remove_first={"worker": (0,)},
        ),
    )
    store.set_status("j", OperatorJobStatus("Running", {"worker": {"running": 3}}, 2))

    shown = _job(store.get("j")).document
    meta = shown["metadata"]
    assert (meta["uid"], meta["generation"]) == (made.uid, changed.generation)
    assert meta["annotations"][ANN_WORKDIR] == "/where/submitted"
    assert json.loads(meta["annotations"][ANN_PLANS]) == ["p-1"]
    assert json.loads(meta["annotations"][ANN_REMOVE_FIRST]) == {"worker": [0]}
    worker = shown["spec"]["roles"]["worker"]
    assert worker["replicas"] == 3
    assert worker["resources"] == {"cpu": "1500m", "memory": GiB, "ephemeral-storage": "1Gi"}
    assert shown["status"]["phase"] == "Running"
    assert store.submitted("j") == _record(store)["document"]


def test_a_refused_document_is_not_kept(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    bad = _document()
    bad["spec"]["roles"]["worker"]["resources"]["cpu"] = "lots"
    with pytest.raises(Invalid, match="invalid TrainingJob"):
        store.create(bad)
    assert store.list() == []
    store.create(_document())
    with pytest.raises(Conflict):
        store.create(_document())


# -- a data dir from before the typed records --------------------------------------------

#: A job as the store kept it before: its TrainingJob document, patched in place by two
#: plans and a status (quantities as the patches wrote them).
OLD = {
    "apiVersion": "dlrover-events.io/v1alpha1",
    "kind": "TrainingJob",
    "metadata": {
        "name": "old",
        "namespace": "default",
        "uid": "0b9c4a3e-old",
        "generation": 3,
        "creationTimestamp": "2026-11-01T00:00:00Z",
        "resourceVersion": "41",
        "annotations": {
            ANN_WORKDIR: "/home/me/project",
            ANN_PLANS: json.dumps(["p-1", "p-2"]),
            ANN_NODE_RESOURCES: json.dumps({"worker": {"1": {"cpu": "1500m", "memory": 2 * GiB}}}),
            ANN_REMOVE_FIRST: json.dumps({"worker": [3]}),
            ANN_ADMISSION: json.dumps(
                {"state": "admitted", "reason": "Admitted", "message": "m", "plan": "p-2"}
            ),
        },
    },
    "spec": {
        "roles": {
            "worker": {
                "replicas": 3,
                "resources": {"cpu": 1, "memory": "2Gi"},
                "elastic": {"mode": "restart", "rendezvousPort": 29555},
                "template": {"spec": {"containers": [{"name": "main", "command": ["true"]}]}},
            }
        }
    },
    "status": {
        "phase": "Running",
        "roles": {"worker": {"running": 3, "pending": 0, "succeeded": 0, "failed": 0}},
        "observedGeneration": 3,
        "lastPlanId": "p-2",
        "lastPlanTime": "2026-11-01T00:05:00Z",
        "conditions": [
            {"type": "Suspended", "status": "False", "reason": "Admitted", "message": "m"}
        ],
    },
}


def _old_data_dir(root: Path) -> None:
    (root / "jobs").mkdir(parents=True)
    (root / "jobs" / "old.json").write_text(json.dumps(OLD))
    bad = json.loads(json.dumps(OLD))
    bad["metadata"].update(name="broken", uid="u-broken")
    bad["spec"]["roles"]["worker"]["resources"]["cpu"] = "lots"
    (root / "jobs" / "broken.json").write_text(json.dumps(bad))
    (root / "resource-version").write_text("41")


async def test_a_data_dir_from_before_the_typed_records_reads_and_is_changed(
    tmp_path: Path,
) -> None:
    _old_data_dir(tmp_path)
    cluster = LocalCluster(tmp_path)

    old = _job(await cluster.get_job("old"))
    assert (old.uid, old.resource_version, old.generation) == ("0b9c4a3e-old", "41", 3)
    assert old.roles["worker"].resources == Resources(cpu_milli=1000, memory=2 * GiB)
    assert old.node_resources == {"worker": {1: Resources(cpu_milli=1500, memory=2 * GiB)}}
    assert (old.remove_first, old.applied_plans) == ({"worker": (3,)}, ("p-1", "p-2"))
    assert old.status is not None and old.status.last_plan_id == "p-2"
    assert old.admission is not None and old.admission.plan_id == "p-2"
    assert cluster._workdir("old") == "/home/me/project"
    listed, _ = await cluster.list_jobs()
    (broken,) = [e for e in listed if e.name == "broken"]
    assert isinstance(broken, UnreadableJob) and "lots" in broken.reason

    changed = await cluster.change_job(
        old,
        JobSpecChange(
            old.resource_version,
            ("p-1", "p-2", "p-3"),
            replicas={"worker": 4},
            node_resources=old.node_resources,  # a change says every node's, as it is after
            remove_first=old.remove_first,
        ),
    )

    assert changed.roles["worker"].replicas == 4
    assert (changed.generation, changed.resource_version) == (4, "42")
    assert changed.status == old.status and changed.node_resources == old.node_resources
    record = json.loads((tmp_path / "jobs" / "old.json").read_text())
    assert record["format"] == FORMAT  # written in the new form at its first write
    assert "status" not in record["document"]
    again = _job(await cluster.get_job("old"))
    assert again == changed
    assert again.document["metadata"]["annotations"][ANN_WORKDIR] == "/home/me/project"
    with pytest.raises(Invalid, match="lots"):  # one that does not read is not changed
        cluster.store.change("broken", JobSpecChange("", ("x",)))
