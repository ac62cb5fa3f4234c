"""A job's success policy (spec.successPolicy.roles), pure: which roles' success ends a
job, and that a job none of whose pods is left to run has ended, never Pending.

The shipped DI-engine example (coordinator, collector, learner: none of worker, chief,
master) used to stay Pending for ever once its pods had all succeeded, and never said
job.completed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]
from hypothesis import given, settings
from hypothesis import strategies as st

from handlers.operator.document.trainingjob import parse_job, status_patch
from handlers.operator.platform.bodies import JobView, PodView, Resources, Termination
from handlers.operator.platform.errors import InvalidJob
from handlers.operator.reconcile.events import job_events
from handlers.operator.reconcile.planning import diff, job_status, outcome, phase, success_roles
from schemas.jobs import JobCompleted

UID = "uid-di"
EXAMPLE = Path(__file__).resolve().parents[4] / "deploy" / "examples" / "trainingjob-di-engine.yaml"


def role(replicas: int, policy: str = "Never") -> dict[str, Any]:
    return {
        "replicas": replicas,
        "resources": {"cpu": 1, "memory": "1Gi"},
        "restartPolicy": policy,
        "template": {"spec": {"containers": [{"name": "main", "image": "t:1"}]}},
    }


def job(roles: dict[str, dict[str, Any]], success: list[str] | None = None) -> JobView:
    spec: dict[str, Any] = {"roles": roles}
    if success is not None:
        spec["successPolicy"] = {"roles": success}
    meta = {"name": "di", "namespace": "ns", "uid": UID, "resourceVersion": "1", "generation": 1}
    return parse_job({"metadata": meta, "spec": spec, "status": {}})


def di_engine(success: list[str] | None = None, collectors: int = 2) -> JobView:
    return job({"coordinator": role(1), "collector": role(collectors), "learner": role(1)}, success)


def pod(role: str, rank: int, phase: str = "Running", exit_code: int | None = None) -> PodView:
    ended = None
    if exit_code is not None:
        ended = Termination("main", exit_code, "Completed" if exit_code == 0 else "Error")
    return PodView(
        name=f"di-{role}-{rank}",
        uid=f"pod-{role}-{rank}",
        job="di",
        job_uid=UID,
        role=role,
        rank=rank,
        index=rank,
        phase=phase,
        deleting=False,
        resources=Resources(cpu_milli=1000, memory=2**30),
        termination=ended,
    )


def done(role: str, rank: int) -> PodView:
    return pod(role, rank, "Succeeded", 0)


def completed(j: JobView, pods: list[PodView]) -> bool:
    return any(isinstance(e, JobCompleted) for e in job_events("prod", j, pods, outcome(j, pods)))


def test_the_shipped_di_engine_example_succeeds_once_all_its_pods_did() -> None:
    obj = yaml.safe_load(EXAMPLE.read_text())
    j = parse_job({**obj, "metadata": {**obj["metadata"], "uid": UID}})
    assert success_roles(j) == ("coordinator", "collector", "learner", "aggregator")
    pods = [done(name, rank) for name, r in j.roles.items() for rank in range(r.replicas)]
    assert outcome(j, pods) == (
        "Succeeded",
        "all pods of coordinator (1), collector (4), learner (1), aggregator (1) succeeded",
    )
    assert phase(j, pods) == "Succeeded"
    assert completed(j, pods)
    status = job_status(j, pods)
    assert status is not None and status_patch(status)["status"]["phase"] == "Succeeded"
    # one pod still running: not yet
    assert outcome(j, [*pods[:-1], pod("aggregator", 0)]) == (None, "")
    assert phase(j, [*pods[:-1], pod("aggregator", 0)]) == "Running"


def test_without_a_policy_a_job_of_free_roles_needs_every_role() -> None:
    j = di_engine()
    pods = [done("coordinator", 0), done("collector", 0), done("collector", 1)]
    assert outcome(j, [*pods, pod("learner", 0)])[0] is None
    assert outcome(j, [*pods, done("learner", 0)])[0] == "Succeeded"


def test_a_policy_naming_the_coordinator_ends_the_job_with_it() -> None:
    j = di_engine(["coordinator"])
    running = [pod("collector", 0), pod("collector", 1), pod("learner", 0)]
    assert outcome(j, [pod("coordinator", 0), *running]) == (None, "")
    pods = [done("coordinator", 0), *running]
    assert outcome(j, pods) == ("Succeeded", "all 1 coordinator pods succeeded")
    assert phase(j, pods) == "Succeeded"
    assert completed(j, pods)
    assert not diff(j, pods).create, "no pod is started for a job that has ended"


def test_a_policy_of_several_roles_needs_each_of_them() -> None:
    j = di_engine(["learner", "coordinator", "learner"])
    assert j.success_roles == ("learner", "coordinator")
    assert outcome(j, [done("learner", 0), pod("coordinator", 0)])[0] is None
    assert outcome(j, [done("learner", 0), done("coordinator", 0), pod("collector", 0)]) == (
        "Succeeded",
        "all pods of learner (1), coordinator (1) succeeded",
    )


def test_a_policy_overrides_the_worker_default() -> None:
    roles = {"chief": role(1), "worker": role(2)}
    assert success_roles(job(roles)) == ("worker",)
    j = job(roles, ["chief"])
    pods = [done("chief", 0), pod("worker", 0), pod("worker", 1)]
    assert outcome(j, pods) == ("Succeeded", "all 1 chief pods succeeded")
    assert outcome(job(roles), pods)[0] is None


def test_the_worker_default_is_unchanged() -> None:
    j = job({"worker": role(2), "ps": role(1)})
    pods = [done("worker", 0), done("worker", 1), pod("ps", 0)]
    assert outcome(j, pods) == ("Succeeded", "all 2 worker pods succeeded")


def test_a_success_role_scaled_to_zero_does_not_keep_a_finished_job_pending() -> None:
    j = job({"coordinator": role(1), "learner": role(0)}, ["learner"])
    pods = [done("coordinator", 0)]
    assert outcome(j, pods) == ("Succeeded", "all pods of every role succeeded")
    assert outcome(j, [pod("coordinator", 0)]) == (None, "")


def test_a_failed_pod_that_is_not_replaced_fails_the_job_whatever_the_policy() -> None:
    j = di_engine(["coordinator"])
    pods = [pod("coordinator", 0), pod("collector", 0, "Failed", 1), pod("learner", 0)]
    ended, reason = outcome(j, pods)
    assert ended == "Failed" and "di-collector-0 exit code 1" in reason


@pytest.mark.parametrize(
    ("success", "says"),
    [
        (["trainer"], "successPolicy names role(s) trainer the job does not have"),
        ("coordinator", "successPolicy.roles must be a list of role names"),
        ([1], "successPolicy.roles must be a list of role names"),
    ],
)
def test_a_policy_the_job_cannot_follow_is_an_invalid_job(success: Any, says: str) -> None:
    with pytest.raises(InvalidJob, match=re.escape(says)):
        di_engine(success)


ROLE_NAMES = ("coordinator", "collector", "learner", "worker")
finished = st.sampled_from([("Succeeded", 0), ("Failed", 1), ("Failed", 137)])


@st.composite
def finished_jobs(draw: st.DrawFn) -> tuple[JobView, list[PodView]]:
    """A job of 1-3 roles (with or without a policy) whose pods have all finished."""
    names = draw(st.lists(st.sampled_from(ROLE_NAMES), min_size=1, max_size=3, unique=True))
    policies = st.sampled_from(["Never", "OnFailure", "ExitCode", "Always"])
    roles = {n: role(draw(st.integers(0, 3)), draw(policies)) for n in names}
    success = draw(st.none() | st.lists(st.sampled_from(names), min_size=1, max_size=3))
    j = job(roles, success)
    pods = []
    for n in names:
        for rank in draw(st.sets(st.integers(0, 4), max_size=4)):
            what, code = draw(finished)
            pods.append(pod(n, rank, what, code))
    return j, pods


@settings(max_examples=300, deadline=None)
@given(finished_jobs())
def test_a_job_whose_pods_have_all_finished_is_never_pending(
    case: tuple[JobView, list[PodView]],
) -> None:
    j, pods = case
    if not pods:
        return  # nothing ran: Pending is what it is
    shown = phase(j, pods)
    assert shown != "Pending", (j.roles, j.success_roles, pods)
    if shown == "Succeeded":
        assert completed(j, pods)
