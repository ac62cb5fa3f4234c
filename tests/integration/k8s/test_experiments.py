"""Experiment resources on the real kube-apiserver v1.20.2, watched by the operator's
ExperimentWatch as the operator's ServiceAccount (deploy/rbac/operator.yaml), against the
session's broker: each submitted once per uid behind the operator's finalizer, an invalid
one said in its status, its status folded from the bus, a deleted one killed (also when
the operator was away at the time), and a trial's TrainingJob owned by it.

"Nothing more was published" is checked without waiting on a clock: the test publishes a
marker with the experiment's key after the watch has handled its list, so the marker lands
in the same partition after anything the watch published, and the tap having read the
marker has read everything before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import EXPERIMENTS
from dlrover_events.settings import Settings
from handlers.operator.kube import experiment
from handlers.operator.kube.client import KubeApi
from handlers.operator.kube.cluster import KubeCluster
from handlers.operator.kube.experiments import ExperimentWatch
from handlers.operator.kube.trainingjob import TRAINING_JOB
from schemas.experiments import (
    DecisionKind,
    ExperimentAction,
    ExperimentActionKind,
    ExperimentSubmitted,
    TrialDecision,
    TrialMetrics,
)
from tests.integration.tap import Tap

from .kube import DEPLOY, GROUP, VERSION, apply_crd, create_namespace, unique_name
from .test_kube_testenv import (
    apply_rbac,
    eventually_allowed,
    expect_forbidden,
    service_account_client,
)
from .test_reconciler_support import DEADLINE_S, role, until

pytestmark = pytest.mark.integration

OPERATOR_SA = "dlrover-events-operator"
PLURAL = experiment.PLURAL


def experiment_body(name: str, **searcher: Any) -> dict[str, Any]:
    """An Experiment as a user applies it (the document of docs/experiments.md)."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Experiment",
        "metadata": {"name": name},
        "spec": {
            "owner": "research",
            "hyperparameters": {
                "lr": {"type": "log", "base": 10, "minval": -4, "maxval": -1},
                "width": {"type": "int", "minval": 8, "maxval": 128},
                "act": {"type": "categorical", "vals": ["relu", "tanh"]},
                "epochs": {"type": "const", "val": 1},
            },
            "searcher": {
                "name": "asha",
                "metric": "val_loss",
                "smaller_is_better": True,
                "max_trials": 4,
                "budget": {"unit": "steps", "max": 64},
                "seed": 7,
            }
            | searcher,
            "trial": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "TrainingJob",
                "spec": {"roles": {"worker": role(1)}},
            },
        },
    }


@pytest.fixture
async def experiment_crd(api: client.ApiClient) -> str:
    crd = await apply_crd(api, DEPLOY / "crds" / "experiments.yaml")
    name: str = crd["metadata"]["name"]
    return name


@pytest.fixture
async def operator_api(
    api: client.ApiClient, namespace: str, experiment_crd: str
) -> AsyncIterator[client.ApiClient]:
    """An ApiClient with the operator's ServiceAccount token, its Role in force."""
    await apply_rbac(api, namespace, "operator.yaml")
    sa = await service_account_client(api, namespace, OPERATOR_SA)
    async with sa:
        custom = client.CustomObjectsApi(sa)
        await eventually_allowed(
            lambda: custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        )
        yield sa


@pytest.fixture
async def tap(settings: Settings, env: str) -> AsyncIterator[Tap]:
    t = Tap(settings, env, (EXPERIMENTS,))
    await t.start()
    try:
        yield t
    finally:
        await t.stop()


@pytest.fixture
async def producer(settings: Settings) -> AsyncIterator[Producer]:
    async with Producer(settings) as p:
        yield p


async def _ready(watch: ExperimentWatch) -> None:
    await watch.informer.synced.wait()
    await watch.caught_up.wait()


@contextlib.asynccontextmanager
async def watching(
    settings: Settings, env: str, api: client.ApiClient, namespace: str
) -> AsyncIterator[ExperimentWatch]:
    """A running ExperimentWatch, once it has handled its first list and read the
    experiments' topics to their end."""
    watch = ExperimentWatch(settings, env, api, namespace, watch_timeout_s=20, retry_s=0.2)
    stop = asyncio.Event()
    task = asyncio.create_task(watch.run(stop))
    try:
        ready = asyncio.create_task(_ready(watch))
        done, _ = await asyncio.wait(
            [task, ready], timeout=DEADLINE_S, return_when=asyncio.FIRST_COMPLETED
        )
        if ready not in done:
            ready.cancel()
            if task.done():
                task.result()
            pytest.fail(f"the experiment watch was not ready within {DEADLINE_S:.0f}s")
        yield watch
    finally:
        stop.set()
        await asyncio.wait_for(task, DEADLINE_S)


class Experiments:
    """The test's Experiments, as the admin reads and writes them."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        got: dict[str, Any] = await self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, body
        )
        return got

    async def get(self, name: str) -> dict[str, Any] | None:
        try:
            got: dict[str, Any] = await self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return got

    async def delete(self, name: str) -> None:
        await self.custom.delete_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name
        )

    def status(
        self, name: str, ok: Callable[[dict[str, Any]], bool]
    ) -> Callable[[], Awaitable[dict[str, Any] | None]]:
        """For `until`: the Experiment once ``ok`` holds of its status."""

        async def check() -> dict[str, Any] | None:
            got = await self.get(name)
            return got if got is not None and ok(got.get("status") or {}) else None

        return check

    def gone(self, name: str) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return await self.get(name) is None

        return check


@pytest.fixture
def experiments(api: client.ApiClient, namespace: str) -> Experiments:
    return Experiments(api, namespace)


async def everything_seen(tap: Tap, producer: Producer, env: str, name: str) -> None:
    """Publish a marker keyed by the experiment and wait for the tap to read it: the tap
    has then read whatever was published under that key before (module docstring)."""
    marker = ExperimentAction(
        env=env,
        source="test-marker",
        experiment=name,
        action=ExperimentActionKind.ACTIVATE,
        reason=f"marker {uuid.uuid4().hex}",
    )
    await producer.publish(marker)
    await tap.until(
        lambda: any(e.event_id == marker.event_id for e in tap.of(ExperimentAction, name)),
        f"the marker of {name}",
    )


def submitted_as(uid: str) -> Callable[[dict[str, Any]], bool]:
    return lambda status: status.get("submittedUid") == uid


def submissions(tap: Tap, name: str) -> list[ExperimentSubmitted]:
    return tap.of(ExperimentSubmitted, name)


def kills(tap: Tap, name: str) -> list[ExperimentAction]:
    return [
        e
        for e in tap.of(ExperimentAction, name)
        if e.action is ExperimentActionKind.KILL and e.source != "test-marker"
    ]


async def test_an_experiment_is_submitted_once_per_uid_and_held(
    settings: Settings,
    env: str,
    namespace: str,
    operator_api: client.ApiClient,
    experiments: Experiments,
    tap: Tap,
    producer: Producer,
) -> None:
    name = unique_name("sweep")
    async with watching(settings, env, operator_api, namespace):
        made = await experiments.create(experiment_body(name))
        uid = made["metadata"]["uid"]
        (sent,) = await tap.until(lambda: submissions(tap, name), f"{name} submitted")
        assert sent.event_id == experiment.event_id(env, uid, "submitted")
        assert sent.spec.searcher.name == "asha"
        assert sent.spec.searcher.max_trials == 4
        assert sent.spec.hyperparameters["epochs"].model_dump() == {"type": "const", "val": 1}
        got = await until(
            experiments.status(name, lambda s: s.get("submittedUid") == uid), "submittedUid"
        )
        assert experiment.FINALIZER in got["metadata"]["finalizers"]
        assert got["status"]["env"] == env
        assert got["status"]["phase"] == "Submitted"
        assert got["status"]["observedGeneration"] == got["metadata"]["generation"]

    # a restarted operator finds it submitted: nothing is published again
    async with watching(settings, env, operator_api, namespace):
        await everything_seen(tap, producer, env, name)
        assert len(submissions(tap, name)) == 1

    # submitted, but the status lost (an operator killed between the two): published
    # again with the same id, which the searcher recognises
    await experiments.custom.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        name,
        [{"op": "remove", "path": "/status/submittedUid"}],
    )
    async with watching(settings, env, operator_api, namespace):
        again = await tap.until(lambda: submissions(tap, name)[1:], f"{name} submitted again")
        assert [e.event_id for e in again] == [sent.event_id]
        await until(
            experiments.status(name, lambda s: s.get("submittedUid") == uid), "submittedUid"
        )


async def test_an_invalid_experiment_is_said_in_its_status_and_never_published(
    settings: Settings,
    env: str,
    namespace: str,
    operator_api: client.ApiClient,
    experiments: Experiments,
    tap: Tap,
    producer: Producer,
) -> None:
    # what the CRD's schema says is refused by the API server itself
    odd = experiment_body(unique_name("odd"), max_trials="many")
    with pytest.raises(ApiException) as refused:
        await experiments.create(odd)
    assert refused.value.status == 422, refused.value.body
    assert "max_trials" in str(refused.value.body)

    # what it cannot say, the operator does, naming the field
    name = unique_name("bad")
    body = experiment_body(name)
    body["spec"]["hyperparameters"]["width"] = {"type": "int", "minval": 128, "maxval": 8}
    async with watching(settings, env, operator_api, namespace):
        await experiments.create(body)
        got = await until(
            experiments.status(name, lambda s: s.get("phase") == "Invalid"), "phase Invalid"
        )
        said = got["status"]["message"]
        assert said == "spec.hyperparameters.width: minval 128 is above maxval 8", said
        assert experiment.FINALIZER not in (got["metadata"].get("finalizers") or [])
        await everything_seen(tap, producer, env, name)
        assert submissions(tap, name) == []
        # deleted, it goes at once: nothing holds it, nothing is killed
        await experiments.delete(name)
        await until(experiments.gone(name), f"{name} gone")


async def test_the_status_shows_the_searchers_decisions_and_the_best_trial(
    settings: Settings,
    env: str,
    namespace: str,
    operator_api: client.ApiClient,
    experiments: Experiments,
    tap: Tap,
    producer: Producer,
) -> None:
    name = unique_name("sweep")

    def decision(seq: int, kind: DecisionKind, trial: int | None, **fields: Any) -> TrialDecision:
        return TrialDecision(
            env=env, source="searcher", experiment=name, seq=seq, decision=kind, trial=trial,
            **fields,
        )  # fmt: skip

    def validation(trial: int, budget: float, value: float) -> TrialMetrics:
        return TrialMetrics(
            env=env, source="trial", experiment=name, trial=trial, step=int(budget),
            budget=budget, validation=True, metrics={"val_loss": value, "acc": 1 - value},
        )  # fmt: skip

    async with watching(settings, env, operator_api, namespace):
        made = await experiments.create(experiment_body(name))
        await tap.until(lambda: submissions(tap, name), f"{name} submitted")
        uid = made["metadata"]["uid"]
        await until(experiments.status(name, lambda s: s.get("submittedUid") == uid), "held")
        for event in [
            decision(0, DecisionKind.CREATE, 0, hparams={"lr": 0.01}, budget=4, rung=0),
            decision(1, DecisionKind.CREATE, 1, hparams={"lr": 0.001}, budget=4, rung=0),
            validation(0, 4, 0.9),
            validation(1, 4, 0.4),
            validation(1, 2, 0.6),
            decision(2, DecisionKind.PAUSE, 0, rung=0, reason="waits at rung 0"),
            decision(3, DecisionKind.RUN, 1, budget=16, rung=1, reason="promoted"),
            # published again by a restarted searcher: applied once
            decision(2, DecisionKind.PAUSE, 0, rung=0, reason="waits at rung 0"),
        ]:
            await producer.publish(event)
        got = await until(
            experiments.status(name, lambda s: s.get("decisions") == 4 and "bestTrial" in s),
            "the decisions in the status",
        )
        status = got["status"]
        assert status["phase"] == "Running"
        assert status["submittedUid"] == uid  # the submission's own fields stay
        assert status["counts"] == {
            "created": 2, "running": 1, "paused": 1, "stopped": 0, "completed": 0
        }  # fmt: skip
        assert status["bestTrial"] == {
            "trial": 1, "job": f"{name}-t1", "value": 0.4, "budget": 4, "hparams": {"lr": 0.001}
        }  # fmt: skip
        assert [(t["trial"], t["state"], t["budget"], t["rung"]) for t in status["trials"]] == [
            (0, "paused", 4, 0),
            (1, "running", 16, 1),
        ]
        assert status["lastDecision"]["seq"] == 3
        assert status["lastDecision"]["reason"] == "promoted"

        pause = ExperimentAction(
            env=env, source="user", experiment=name, action=ExperimentActionKind.PAUSE,
            reason="the cluster is needed",
        )  # fmt: skip
        await producer.publish(pause)
        got = await until(
            experiments.status(name, lambda s: s.get("phase") == "Paused"), "phase Paused"
        )
        assert got["status"]["message"] == "the cluster is needed"
        await producer.publish(decision(4, DecisionKind.DONE, None, reason="max_trials reached"))
        got = await until(
            experiments.status(name, lambda s: s.get("phase") not in ("Paused", "Running")),
            "the experiment ended",
        )
        assert got["status"]["phase"] == "Done", got["status"]
        assert got["status"]["message"] == "max_trials reached"
        # seq 2 published again before the done, in the same partition: applied once
        assert got["status"]["decisions"] == 5


async def test_a_deleted_experiment_is_killed_also_when_the_operator_was_away(
    settings: Settings,
    env: str,
    namespace: str,
    operator_api: client.ApiClient,
    experiments: Experiments,
    tap: Tap,
) -> None:
    first, second = unique_name("sweep"), unique_name("sweep")
    async with watching(settings, env, operator_api, namespace):
        uids: dict[str, str] = {}
        for name in (first, second):
            uid = (await experiments.create(experiment_body(name)))["metadata"]["uid"]
            uids[name] = uid
            await until(experiments.status(name, submitted_as(uid)), f"{name} held")
        await experiments.delete(first)
        (kill,) = await tap.until(lambda: kills(tap, first), f"{first} killed")
        assert kill.event_id == experiment.event_id(env, uids[first], "kill")
        assert kill.reason == experiment.KILL_REASON
        await until(experiments.gone(first), f"{first} gone")

    # the operator away: the Experiment waits, being deleted, held by the finalizer
    await experiments.delete(second)
    waiting = await experiments.get(second)
    assert waiting is not None and waiting["metadata"].get("deletionTimestamp")
    assert kills(tap, second) == []
    async with watching(settings, env, operator_api, namespace):
        (kill,) = await tap.until(lambda: kills(tap, second), f"{second} killed")
        assert kill.event_id == experiment.event_id(env, uids[second], "kill")
        await until(experiments.gone(second), f"{second} gone")


async def test_a_trial_job_is_owned_by_its_experiment(
    api: client.ApiClient,
    trainingjob_crd: str,
    namespace: str,
    operator_api: client.ApiClient,
    experiments: Experiments,
) -> None:
    """The Kubernetes platform creates a trial's job (a JobRequest) owned by the
    Experiment its label names, as the operator's ServiceAccount; a job of an experiment
    without a resource (`experiment create`), or of none, owns nothing."""
    name = unique_name("sweep")
    made = await experiments.create(experiment_body(name))
    cluster = KubeCluster(KubeApi(operator_api, TRAINING_JOB, namespace))

    def trial_job(job: str, labels: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TrainingJob",
            "metadata": {"name": job, "labels": labels},
            "spec": {"roles": {"worker": copy.deepcopy(role(1))}},
        }

    trial = await cluster.submit_job(trial_job(f"{name}-t0", {experiment.EXPERIMENT_LABEL: name}))
    raw = await cluster.api.get_job(trial.name)
    assert raw is not None
    assert raw["metadata"]["ownerReferences"] == [
        experiment.owner_reference(name, made["metadata"]["uid"])
    ]
    for job, labels in [
        (unique_name("cli-t0"), {experiment.EXPERIMENT_LABEL: "made-by-the-cli"}),
        (unique_name("plain"), {}),
    ]:
        created = await cluster.submit_job(trial_job(job, labels))
        plain = await cluster.api.get_job(created.name)
        assert plain is not None
        assert "ownerReferences" not in plain["metadata"], plain["metadata"]


async def test_the_operator_may_watch_and_patch_experiments_here_and_nothing_more(
    api: client.ApiClient,
    namespace: str,
    operator_api: client.ApiClient,
    experiments: Experiments,
) -> None:
    name = unique_name("sweep")
    await experiments.create(experiment_body(name))
    other = await create_namespace(api)
    custom = client.CustomObjectsApi(operator_api)
    await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    await custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
    await custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name, [{"op": "add", "path": "/status", "value": {}}]
    )
    await custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        name,
        [{"op": "add", "path": "/metadata/finalizers", "value": [experiment.FINALIZER]}],
    )
    denied = [
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, experiment_body(unique_name("mine"))
        ),
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name),
        custom.list_namespaced_custom_object(GROUP, VERSION, other, PLURAL),
        custom.get_namespaced_custom_object(GROUP, VERSION, other, PLURAL, name),
    ]
    for call in denied:
        await expect_forbidden(call, namespace, OPERATOR_SA)
