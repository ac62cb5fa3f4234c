"""Warm spares on Kubernetes, the pure part (handlers.operator.kube.spares): what a spare
pod is (the role's pod less what only a pod knows, no node), which new pod may take it,
what its admission writes, and how many a job keeps."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

from dlrover_events.sdk.identity import (
    ELASTIC_ADMIT_ENV,
    ELASTIC_EXPECT_ENV,
    ELASTIC_STORE_ENV,
    ELASTIC_STORE_HOST_ENV,
    RANK_ENV,
)
from handlers.operator.document.trainingjob import parse_job
from handlers.operator.kube.pods import LABEL_INDEX, LABEL_RANK, parse_pod
from handlers.operator.kube.spares import (
    ADMISSION_PATH,
    ADMISSION_VOLUME,
    ANN_SPARE_ADMISSION,
    ANN_SPARE_KEY,
    LABEL_SPARE,
    Spare,
    admission_patch,
    candidates,
    keep,
    parse_spare,
    prototype,
    spare_key,
    spare_manifest,
    spare_name,
    wanted,
)
from handlers.operator.kube.trainingjob import PEERS_VOLUME, pod_manifest
from handlers.operator.platform.bodies import JobView, NewPod, Resources
from tests.unit.operator.reconcile.test_planning import UID, job_obj


def in_place(spares: int = 1, replicas: int = 2, command: str = "t.py", **role: Any) -> JobView:
    elastic = {"command": ["python", command], "mode": "inPlace", "spares": spares}
    return parse_job(job_obj(replicas, elastic=elastic, **role))


def manifest(job: JobView, rank: int, index: int | None = None, **res: Any) -> dict[str, Any]:
    resources = Resources(**res) if res else job.roles["worker"].resources
    new = NewPod("worker", rank, rank if index is None else index, resources)
    return pod_manifest(job, new, "prod")


def env_of(obj: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in obj["spec"]["containers"][0]["env"]}


def merged(obj: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386, as the API server applies a merge patch."""
    out = copy.deepcopy(obj)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def listed(obj: dict[str, Any], phase: str = "Running", version: str = "10") -> dict[str, Any]:
    """A pod as the API server lists it."""
    out = copy.deepcopy(obj)
    out["metadata"] = {**out["metadata"], "uid": "u-" + out["metadata"]["name"]}
    out["metadata"]["resourceVersion"] = version
    out["status"] = {"phase": phase}
    return out


def spare(name: str, phase: str = "Running", *, key: str = "k", uid: str = UID, **kw: Any) -> Spare:
    return Spare(name, uid, "worker", key, phase, kw.get("deleting", False), "1")


def test_a_spare_is_the_roles_pod_less_what_only_a_pod_knows_and_no_node() -> None:
    job = in_place(spares=1)
    host = manifest(job, 0)  # the store's host: it has what a spare must not
    assert env_of(host)[ELASTIC_STORE_HOST_ENV] == "1"
    got = spare_manifest(host, "j-worker-spare-0")
    meta = got["metadata"]
    assert meta["name"] == "j-worker-spare-0"
    assert meta["labels"][LABEL_SPARE] == "true"
    assert LABEL_RANK not in meta["labels"] and LABEL_INDEX not in meta["labels"]
    assert meta["annotations"][ANN_SPARE_KEY] == spare_key(host)
    assert meta["ownerReferences"] == host["metadata"]["ownerReferences"]  # goes with the job
    env = env_of(got)
    assert not {RANK_ENV, ELASTIC_STORE_HOST_ENV, ELASTIC_EXPECT_ENV} & set(env)
    assert env[ELASTIC_STORE_ENV] == env_of(host)[ELASTIC_STORE_ENV]
    assert env[ELASTIC_ADMIT_ENV] == ADMISSION_PATH
    (container,) = got["spec"]["containers"]
    assert container["command"] == host["spec"]["containers"][0]["command"]
    assert container["resources"] == host["spec"]["containers"][0]["resources"]
    # its admission file, beside the job's peers file every pod of the job has
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert set(mounts) == {ADMISSION_VOLUME, PEERS_VOLUME}
    mount = mounts[ADMISSION_VOLUME]
    assert ADMISSION_PATH.startswith(mount["mountPath"] + "/") and mount["readOnly"]
    (volume,) = [v for v in got["spec"]["volumes"] if v["name"] == ADMISSION_VOLUME]
    (item,) = volume["downwardAPI"]["items"]
    assert item["fieldRef"]["fieldPath"] == f"metadata.annotations['{ANN_SPARE_ADMISSION}']"
    assert mount["mountPath"] + "/" + item["path"] == ADMISSION_PATH
    # not a node: not counted, no node events, no rendezvous Service selects it
    assert parse_pod(listed(got)) is None
    assert parse_spare(listed(got)) == Spare(
        "j-worker-spare-0", UID, "worker", spare_key(host), "Running", False, "10"
    )
    assert parse_spare(listed(host)) is None


def test_a_new_pod_takes_a_spare_only_when_it_would_be_the_same_pod() -> None:
    job = in_place(spares=1, replicas=2)
    key = spare_key(manifest(job, 2))
    # another rank, index, host or not, another replica count: the same spare fits
    assert spare_key(manifest(job, 0)) == key
    assert spare_key(manifest(job, 5, index=9)) == key
    assert spare_key(manifest(in_place(spares=1, replicas=4), 3)) == key
    assert spare_key(pod_manifest(job, prototype(job, "worker"), "prod")) == key
    # other resources, another env, another command: a cold start
    assert spare_key(manifest(job, 2, cpu_milli=4000, memory=4 << 30)) != key
    assert spare_key(pod_manifest(job, prototype(job, "worker"), "staging")) != key
    assert spare_key(manifest(in_place(spares=1, command="u.py"), 2)) != key


def test_admission_makes_the_spare_the_nodes_pod_and_tells_its_worker() -> None:
    job = in_place(spares=1, replicas=3)
    new = NewPod("worker", 2, 4, job.roles["worker"].resources)
    pod = manifest(job, 2, index=4)
    obj = listed(spare_manifest(manifest(job, 3), "j-worker-spare-0"), version="41")
    found = parse_spare(obj)
    assert found is not None
    patch = admission_patch(found, new, pod)
    assert patch["metadata"]["resourceVersion"] == "41"  # a precondition: read, then changed
    after = merged(obj, patch)
    view = parse_pod(after)
    assert view is not None and (view.role, view.rank, view.index) == ("worker", 2, 4)
    assert view.name == "j-worker-spare-0" and view.job_uid == UID and view.running
    assert parse_spare(after) is None  # a node now, no spare
    told = json.loads(after["metadata"]["annotations"][ANN_SPARE_ADMISSION])
    assert told["pod"] == "j-worker-spare-0"
    assert told["env"][RANK_ENV] == "2"
    assert told["env"][ELASTIC_EXPECT_ENV] == "3"
    assert ELASTIC_STORE_HOST_ENV not in told["env"]
    host = admission_patch(found, NewPod("worker", 0, 5, Resources()), manifest(job, 0, index=5))
    told = json.loads(host["metadata"]["annotations"][ANN_SPARE_ADMISSION])
    assert told["env"][ELASTIC_STORE_HOST_ENV] == "1"  # a new host rank hosts the store


def test_the_warmest_spare_of_the_same_job_role_and_form_is_taken() -> None:
    job = in_place()
    spares = [
        spare("s-3", "Pending"),
        spare("s-2"),
        spare("s-1", key="old"),
        spare("s-0", uid="earlier-job"),
        spare("s-4", deleting=True),
        spare("s-5", "Failed"),
        spare("s-6"),
    ]
    assert [s.name for s in candidates(spares, job, "worker", "k")] == ["s-2", "s-6", "s-3"]
    assert candidates(spares, job, "chief", "k") == []


def test_a_running_job_keeps_as_many_spares_as_its_in_place_roles_ask() -> None:
    job = in_place(spares=2)
    assert wanted(job, ended=False) == {"worker": 2}
    assert wanted(job, ended=True) == {}
    assert wanted(replace(job, suspended=True), ended=False) == {}
    assert wanted(in_place(spares=0), ended=False) == {}
    assert wanted(in_place(spares=1, replicas=0, minReplicas=0), ended=False) == {}
    restart = parse_job(job_obj(2, elastic={"command": ["python", "t.py"]}))
    assert wanted(restart, ended=False) == {}

    keys = {"worker": "k"}
    assert keep(job, [], {"worker": 2}, keys).create == {"worker": 2}
    one = keep(job, [spare("s-0", "Pending")], {"worker": 2}, keys)
    assert one.create == {"worker": 1} and one.delete == ()
    # of an older form, of an earlier job of that name, ended, one too many: they go
    got = keep(
        job,
        [
            spare("s-0", "Pending"),
            spare("s-1"),
            spare("s-2"),
            spare("s-3", key="old"),
            spare("s-4", uid="earlier-job"),
            spare("s-5", "Failed"),
            spare("s-6", deleting=True),
        ],
        {"worker": 2},
        keys,
    )
    assert sorted(got.delete) == ["s-0", "s-3", "s-4", "s-5"]  # running ones are kept first
    assert got.create == {} and [s.name for s in got.ended] == ["s-5"]
    # a job that ended, or is suspended, keeps none
    gone = keep(job, [spare("s-1"), spare("s-2", "Pending")], {}, {})
    assert sorted(gone.delete) == ["s-1", "s-2"] and gone.create == {}


def test_spare_names_are_decided_the_smallest_free() -> None:
    assert spare_name("j", "worker", []) == "j-worker-spare-0"
    taken = ["j-worker-0", "j-worker-spare-0", "j-worker-spare-2"]
    assert spare_name("j", "worker", taken) == "j-worker-spare-1"
