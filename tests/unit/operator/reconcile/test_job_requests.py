"""A JobRequest's decision (reconcile/requests.py) and its intake (reconcile/intake.py):
created, refused with why, or there already; each request id created once, also when it
is read again after a crash between the job's creation and its answer being kept.

The intake runs on the local platform's real job store in a temporary directory (no
process is started: no operator runs) with an in-memory ledger."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from handlers.operator.local.cluster import LocalCluster
from handlers.operator.platform.api import JobEntry
from handlers.operator.platform.bodies import JobView
from handlers.operator.platform.errors import Unavailable
from handlers.operator.reconcile import requests
from handlers.operator.reconcile.intake import JobIntake, RequestLedger
from handlers.operator.reconcile.requests import OWNER_LABEL, REQUEST_LABEL, Answer
from schemas.codec import decode, encode
from schemas.envelope import Event
from schemas.requests import JobDeletion, JobRequest, JobRequestResult, JobRequestStatus

ENV = "prod"


def trainingjob(name: str | None = "trial-1", replicas: int = 2, **meta: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {**meta}
    if name is not None:
        metadata["name"] = name
    return {
        "apiVersion": "dlrover-events.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": metadata,
        "spec": {
            "roles": {
                "worker": {
                    "replicas": replicas,
                    "minReplicas": 1,
                    "maxReplicas": 4,
                    "template": {
                        "spec": {"containers": [{"name": "main", "command": ["sleep", "60"]}]}
                    },
                }
            }
        },
    }


def request(
    request_id: str = "req-1", name: str = "trial-1", document: dict[str, Any] | None = None
) -> JobRequest:
    return JobRequest(
        env=ENV,
        source="searcher",
        request_id=request_id,
        name=name,
        document=trainingjob(name) if document is None else document,
        reason="trial 1 of experiment lr-sweep",
        owner="lr-sweep",
    )


# -- the event ---------------------------------------------------------------------------


def test_a_request_is_keyed_by_its_job_and_says_who_asks() -> None:
    asked = request()
    assert asked.key == "trial-1"
    assert decode(encode(asked)) == asked
    with pytest.raises(ValidationError, match="who asks"):
        JobRequest(env=ENV, request_id="r", name="a", document={})
    with pytest.raises(ValidationError, match="must be the job's name"):
        JobRequest(env=ENV, source="s", key="b", request_id="r", name="a", document={})
    with pytest.raises(ValidationError, match="request_id"):  # kept as a label value
        JobRequest(env=ENV, source="s", request_id="not a label", name="a", document={})
    with pytest.raises(ValidationError, match="name"):  # a DNS label on every platform
        JobRequest(env=ENV, source="s", request_id="r", name="Trial_1", document={})


def test_a_created_answer_names_its_job() -> None:
    with pytest.raises(ValidationError, match="names the job"):
        JobRequestResult(
            env=ENV, request_id="r", name="a", status=JobRequestStatus.CREATED, reason=""
        )


# -- the decision (pure) -----------------------------------------------------------------


def test_the_document_is_checked_as_job_submit_checks_it_and_marked() -> None:
    body = requests.document_of(request())
    assert isinstance(body, dict)
    assert body["metadata"]["name"] == "trial-1"
    assert body["metadata"]["labels"] == {REQUEST_LABEL: "req-1", OWNER_LABEL: "lr-sweep"}
    # a document without a name takes the request's
    unnamed = requests.document_of(request(document=trainingjob(name=None)))
    assert isinstance(unnamed, dict) and unnamed["metadata"]["name"] == "trial-1"


@pytest.mark.parametrize(
    ("document", "why"),
    [
        (trainingjob(replicas=9), "invalid job: role worker: 9 replicas, above maxReplicas 4"),
        (trainingjob(name="other"), "the document names job 'other', the request 'trial-1'"),
        ({**trainingjob(), "kind": "PyTorchJob"}, "invalid job: the request must hold one"),
        ({**trainingjob(), "metadata": "x"}, "the document's metadata must be an object"),
        (trainingjob(labels=["x"]), "the document's metadata.labels must be an object"),
    ],
)
def test_a_bad_document_is_refused_with_why(document: dict[str, Any], why: str) -> None:
    answer = requests.document_of(request(document=document))
    assert isinstance(answer, Answer)
    assert answer.status == JobRequestStatus.REFUSED
    assert answer.reason.startswith(why), answer.reason
    assert answer.job is None


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


def test_a_job_of_that_name_is_this_request_s_or_someone_else_s() -> None:
    mine = requests.answer_existing(request(), _job({REQUEST_LABEL: "req-1"}))
    assert mine.status == JobRequestStatus.CREATED
    assert mine.job is not None and mine.job.uuid == "u-1"
    other = requests.answer_existing(request(), _job({REQUEST_LABEL: "req-0"}))
    assert other.status == JobRequestStatus.EXISTS
    assert other.reason == (
        "job trial-1 exists already (uid u-1, created by request req-0): nothing was created"
    )
    by_hand = requests.answer_existing(request(), _job({}))
    assert (by_hand.status, by_hand.reason) == (
        JobRequestStatus.EXISTS,
        "job trial-1 exists already (uid u-1): nothing was created",
    )


def test_the_same_delivery_answered_the_same_way_keeps_its_id() -> None:
    asked = request()
    answer = Answer(JobRequestStatus.REFUSED, "x" * 5000)
    one = requests.result(ENV, asked, answer, "kube-operator")
    again = requests.result(ENV, asked, answer, "kube-operator")
    assert one.event_id == again.event_id
    assert one.key == "trial-1" and one.requester == "searcher" and one.owner == "lr-sweep"
    assert len(one.reason) == 2048 and one.reason.endswith("...")
    other = requests.result(ENV, asked, Answer(JobRequestStatus.REFUSED, "y"), "kube-operator")
    assert other.event_id != one.event_id


# -- the intake, on the local platform's job store ------------------------------------------


class MemoryLedger(RequestLedger):
    """The env's job_requests table, as a dict."""

    def __init__(self) -> None:
        self.rows: dict[str, Answer] = {}

    async def answer(self, request_id: str) -> Answer | None:
        return self.rows.get(request_id)

    async def record(self, request: JobRequest | JobDeletion, answer: Answer) -> bool:
        if request.request_id in self.rows:
            return False
        self.rows[request.request_id] = answer
        return True


class Intake:
    def __init__(self, root: Path, ledger: MemoryLedger | None = None) -> None:
        self.cluster = LocalCluster(root)
        self.ledger = ledger or MemoryLedger()
        self.said: list[JobRequestResult] = []
        self.intake = JobIntake(ENV, self.cluster, self.ledger, self._publish, "kube-operator")

    async def _publish(self, event: Event) -> None:
        assert isinstance(event, JobRequestResult)
        self.said.append(event)

    async def ask(self, asked: JobRequest | JobDeletion) -> JobRequestResult:
        await self.intake.answer(asked)
        return self.said[-1]


async def test_a_request_creates_its_job_once(tmp_path: Path) -> None:
    desk = Intake(tmp_path)
    asked = request()
    first = await desk.ask(asked)
    assert first.status == JobRequestStatus.CREATED, first
    job = await desk.cluster.get_job("trial-1")
    assert isinstance(job, JobView)
    assert first.job is not None and first.job.uuid == job.uid
    assert job.labels[OWNER_LABEL] == "lr-sweep" and job.labels[REQUEST_LABEL] == "req-1"

    # delivered again, and again after its job was deleted: the first answer, no new job
    again = await desk.ask(asked)
    assert (again.status, again.job) == (JobRequestStatus.CREATED, first.job)
    assert again.reason == f"already answered: {first.reason}"
    await desk.cluster.delete_job("trial-1")
    assert (await desk.ask(asked)).status == JobRequestStatus.CREATED
    assert await desk.cluster.get_job("trial-1") is None

    # another request for a name that is taken creates nothing
    await desk.ask(request("req-2", "trial-2"))
    taken = await desk.ask(request("req-3", "trial-2"))
    assert taken.status == JobRequestStatus.EXISTS
    assert "created by request req-2" in taken.reason


async def test_a_request_read_again_after_a_crash_finds_its_job(tmp_path: Path) -> None:
    """The job created, the answer not kept (the operator died in between): the request
    read again by the next operator is answered created, with the same job."""
    crashed = Intake(tmp_path)
    asked = request()
    await crashed.ask(asked)
    made = crashed.said[-1].job
    restarted = Intake(tmp_path, MemoryLedger())  # its answer never reached the ledger
    again = await restarted.ask(asked)
    assert (again.status, again.job) == (JobRequestStatus.CREATED, made)
    assert again.reason == "job trial-1 was created by this request before"
    jobs, _ = await restarted.cluster.list_jobs()
    assert [j.name for j in jobs] == ["trial-1"]


async def test_refusals_are_kept_and_said_again(tmp_path: Path) -> None:
    desk = Intake(tmp_path)
    bad = request(document=trainingjob(replicas=0))
    refused = await desk.ask(bad)
    assert refused.status == JobRequestStatus.REFUSED
    assert "below minReplicas 1" in refused.reason
    assert await desk.cluster.get_job("trial-1") is None
    assert (await desk.ask(bad)).reason == f"already answered: {refused.reason}"


async def test_a_name_taken_meanwhile_is_answered_from_what_is_there(tmp_path: Path) -> None:
    """Another door creates the job between the intake's look and its create: the
    platform's Conflict is not the answer; the job there now is."""
    desk = Intake(tmp_path)
    real_submit = desk.cluster.submit_job
    looks: list[JobEntry | None] = []

    async def submit_after_someone(document: Any) -> JobView:
        await real_submit(trainingjob("trial-1"))  # `job submit` got there first
        looks.append(await desk.cluster.get_job("trial-1"))
        return await real_submit(document)

    desk.cluster.submit_job = submit_after_someone  # type: ignore[method-assign]
    answer = await desk.ask(request())
    assert answer.status == JobRequestStatus.EXISTS, answer
    assert looks and isinstance(looks[0], JobView)
    assert answer.job is not None and answer.job.uuid == looks[0].uid


async def test_the_platform_away_keeps_nothing(tmp_path: Path) -> None:
    """A platform error is raised (the consumer reads the request again), not answered."""
    desk = Intake(tmp_path)

    async def away(document: Any) -> JobView:
        raise Unavailable("the platform is away")

    desk.cluster.submit_job = away  # type: ignore[method-assign]
    with pytest.raises(Unavailable, match="away"):
        await desk.ask(request())
    assert desk.ledger.rows == {} and desk.said == []


def test_request_ids_are_per_request() -> None:
    # two requests of one searcher differ by id, not by content
    a, b = request(str(uuid.uuid4())), request(str(uuid.uuid4()))
    assert requests.result(ENV, a, Answer(JobRequestStatus.REFUSED, "x"), "s").event_id != (
        requests.result(ENV, b, Answer(JobRequestStatus.REFUSED, "x"), "s").event_id
    )
