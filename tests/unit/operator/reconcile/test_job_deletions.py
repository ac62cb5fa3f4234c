"""A JobDeletion's decision (reconcile/requests.py) and its intake (reconcile/intake.py):
a job is deleted only when its owner label is the deletion's owner; ``deleted``,
``absent`` or ``refused`` with why; each request id answered once, kept in the ledger as a
creation's answer is.

The intake runs on the local platform's real job store in a temporary directory (no
process is started) with the in-memory ledger of test_job_requests.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from handlers.operator.platform.bodies import JobView, UnreadableJob
from handlers.operator.reconcile import requests
from handlers.operator.reconcile.requests import FINAL, OWNER_LABEL, Answer
from schemas.codec import decode, encode
from schemas.requests import JobDeletion, JobRequestStatus
from tests.unit.operator.reconcile.test_job_requests import (
    ENV,
    Intake,
    MemoryLedger,
    request,
    trainingjob,
)


def deletion(
    request_id: str = "del-1", name: str = "trial-1", owner: str = "lr-sweep"
) -> JobDeletion:
    return JobDeletion(
        env=ENV,
        source="searcher",
        request_id=request_id,
        name=name,
        owner=owner,
        reason="experiment lr-sweep killed",
    )


def _job(labels: dict[str, str]) -> JobView:
    return JobView(
        name="trial-1",
        namespace="default",
        uid="u-1",
        resource_version="1",
        generation=1,
        roles={},
        labels=labels,
    )


# -- the event ---------------------------------------------------------------------------


def test_a_deletion_is_keyed_by_its_job_and_says_who_and_for_whom() -> None:
    asked = deletion()
    assert asked.key == "trial-1"
    assert decode(encode(asked)) == asked
    with pytest.raises(ValidationError, match="who asks"):
        JobDeletion(env=ENV, request_id="r", name="a", owner="o")
    with pytest.raises(ValidationError, match="owner"):
        JobDeletion.model_validate({"env": ENV, "source": "s", "request_id": "r", "name": "a"})


# -- the decision (pure) -----------------------------------------------------------------


def test_only_the_owner_s_job_is_deleted() -> None:
    assert requests.deletion_refusal(deletion(), _job({OWNER_LABEL: "lr-sweep"})) is None
    absent = requests.deletion_refusal(deletion(), None)
    assert absent == Answer(JobRequestStatus.ABSENT, "no job trial-1: nothing was deleted")

    other = requests.deletion_refusal(deletion(), _job({OWNER_LABEL: "other-sweep"}))
    assert other is not None and other.status == JobRequestStatus.REFUSED
    assert (
        other.reason == "job trial-1 is owned by other-sweep, not by lr-sweep: nothing was deleted"
    )
    assert other.job is not None and other.job.uuid == "u-1"

    nobody = requests.deletion_refusal(deletion(), _job({}))
    assert nobody is not None and nobody.status == JobRequestStatus.REFUSED
    assert "owned by no one (no label dlrover-events.io/owner)" in nobody.reason

    unreadable = UnreadableJob(name="trial-1", uid="u-1", resource_version="1", reason="bad")
    dark = requests.deletion_refusal(deletion(), unreadable)
    assert dark is not None and dark.status == JobRequestStatus.REFUSED
    assert dark.reason.startswith("job trial-1 cannot be read (bad)")


def test_deletion_answers_are_final_and_keyed_by_the_deletion() -> None:
    assert {JobRequestStatus.DELETED, JobRequestStatus.ABSENT} <= FINAL
    asked = deletion()
    answer = Answer(JobRequestStatus.ABSENT, "no job trial-1: nothing was deleted")
    said = requests.result(ENV, asked, answer, "kube-operator")
    assert said.event_id == requests.result(ENV, asked, answer, "kube-operator").event_id
    assert (said.request_id, said.name, said.key) == ("del-1", "trial-1", "trial-1")
    assert (said.owner, said.requester) == ("lr-sweep", "searcher")


# -- the intake, on the local platform's job store ------------------------------------------


def owned(name: str = "trial-1", owner: str | None = "lr-sweep") -> dict[str, Any]:
    labels = {} if owner is None else {OWNER_LABEL: owner}
    return trainingjob(name, labels=labels)


async def test_a_deletion_deletes_its_owner_s_job_once(tmp_path: Path) -> None:
    desk = Intake(tmp_path)
    made = await desk.ask(request())  # created with the owner's label, as a searcher asks
    assert made.status == JobRequestStatus.CREATED
    gone = await desk.ask(deletion())
    assert gone.status == JobRequestStatus.DELETED, gone
    assert gone.reason == "job trial-1 deleted on the local platform"
    assert gone.job == made.job
    assert await desk.cluster.get_job("trial-1") is None
    assert desk.ledger.rows["del-1"].status == JobRequestStatus.DELETED

    # delivered again, even once a job of that name is there again: the first answer
    await desk.cluster.submit_job(owned())
    again = await desk.ask(deletion())
    assert (again.status, again.job) == (JobRequestStatus.DELETED, made.job)
    assert again.reason == f"already answered: {gone.reason}"
    assert await desk.cluster.get_job("trial-1") is not None


async def test_someone_else_s_job_is_refused_and_a_missing_one_absent(tmp_path: Path) -> None:
    desk = Intake(tmp_path)
    await desk.cluster.submit_job(owned("trial-1", owner="other-sweep"))
    await desk.cluster.submit_job(owned("trial-2", owner=None))  # `job submit`'s own
    refused = await desk.ask(deletion("del-1", "trial-1"))
    assert refused.status == JobRequestStatus.REFUSED
    assert "owned by other-sweep, not by lr-sweep" in refused.reason
    unowned = await desk.ask(deletion("del-2", "trial-2"))
    assert unowned.status == JobRequestStatus.REFUSED
    assert [j.name for j in (await desk.cluster.list_jobs())[0]] == ["trial-1", "trial-2"]

    absent = await desk.ask(deletion("del-3", "trial-3"))
    assert absent.status == JobRequestStatus.ABSENT
    # kept: a job of that name created since is not deleted by the same request
    await desk.cluster.submit_job(owned("trial-3"))
    assert (await desk.ask(deletion("del-3", "trial-3"))).status == JobRequestStatus.ABSENT
    assert await desk.cluster.get_job("trial-3") is not None
    assert (await desk.ask(deletion("del-4", "trial-3"))).status == JobRequestStatus.DELETED


async def test_a_deletion_read_again_after_a_crash_finds_its_job_gone(tmp_path: Path) -> None:
    """Deleted, the answer not kept (the operator died in between): the deletion read
    again by the next operator deletes nothing more and says the job is absent."""
    crashed = Intake(tmp_path)
    await crashed.ask(request())
    await crashed.ask(deletion())
    restarted = Intake(tmp_path, MemoryLedger())
    again = await restarted.ask(deletion())
    assert again.status == JobRequestStatus.ABSENT
