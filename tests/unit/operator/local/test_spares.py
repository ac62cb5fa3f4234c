"""Warm spares of the local platform, the pure part: which roles keep how many, what a
spare runs, and which spare a new pod may take."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlrover_events.sdk.identity import (
    ELASTIC_ADMIT_ENV,
    ELASTIC_STORE_ENV,
    ELASTIC_STORE_HOST_ENV,
    RANK_ENV,
)
from handlers.operator.document.trainingjob import parse_job
from handlers.operator.local.spares import SpareKey, admission, spare_spec, take, wanted
from tests.unit.operator.reconcile.test_planning import job_obj


def in_place(spares: int, replicas: int = 2, phase: str | None = None, **more: Any) -> Any:
    obj = job_obj(
        replicas,
        elastic={"command": ["python", "t.py"], "mode": "inPlace", "spares": spares, **more},
    )
    if phase:
        obj["status"] = {"phase": phase}
    return parse_job(obj)


def pod_spec(**env: str) -> dict[str, Any]:
    return {
        "name": "j-worker-1",
        "command": ["torchrun", "--standalone", "python", "t.py"],
        "env": {"PATH": "/bin", ELASTIC_STORE_ENV: "127.0.0.1:1", **env},
        "cwd": "/w",
        "memory": 4 << 30,
        "enforcement": "none",
        "grace_s": 15.0,
    }


def test_only_running_in_place_roles_with_spares_keep_them() -> None:
    assert wanted([in_place(2)]) == {("uid-1", "worker"): 2}
    assert wanted([in_place(0)]) == {}
    assert wanted([in_place(1, phase="Succeeded")]) == {}
    assert wanted([in_place(1, replicas=0, minReplicas=0)]) == {}  # scaled to nothing
    restart = parse_job(job_obj(2, elastic={"command": ["python", "t.py"]}))
    assert wanted([restart]) == {}


def test_a_spare_runs_the_pods_command_without_what_only_a_pod_knows(tmp_path: Path) -> None:
    pod = pod_spec(**{RANK_ENV: "0", ELASTIC_STORE_HOST_ENV: "1"})
    spare = spare_spec(pod, "j-worker-spare-1", tmp_path / "admit.json")
    assert spare["command"] == pod["command"] and spare["memory"] == pod["memory"]
    assert spare["name"] == "j-worker-spare-1"
    assert RANK_ENV not in spare["env"] and ELASTIC_STORE_HOST_ENV not in spare["env"]
    assert spare["env"][ELASTIC_ADMIT_ENV] == str(tmp_path / "admit.json")
    assert spare["env"][ELASTIC_STORE_ENV] == "127.0.0.1:1"
    got = admission("j-worker-3", pod_spec(**{RANK_ENV: "3"}))
    assert got["pod"] == "j-worker-3" and got["env"][RANK_ENV] == "3"


def test_a_pod_takes_only_a_spare_made_for_the_same() -> None:
    key = SpareKey.of("uid-1", "worker", pod_spec())
    assert SpareKey.from_record(key.as_record()) == key
    other_job = SpareKey.of("uid-2", "worker", pod_spec())
    more_memory = SpareKey.of("uid-1", "worker", {**pod_spec(), "memory": 8 << 30})
    spares = {"b": key, "a": key, "x": other_job, "y": more_memory}
    assert take(spares, key) == "a"
    assert take({"x": other_job, "y": more_memory}, key) is None
    assert take(spares, more_memory) == "y"
