"""Issue 34's test on the real kube-apiserver v1.20.2: an Experiment resource creates its
trials' TrainingJobs, suspends and resumes them, and deletes them with the experiment.

Real parts end to end: the operator of the env on the Kubernetes platform (its reconciler
and its Experiment watch, as the operator's ServiceAccount under deploy/rbac/operator.yaml),
the searcher service (streams/searcher/runtime, its checkpoint in the env's Postgres), the
session's broker and Postgres. The experiments recorder is not needed: the resource's
status is the operator's own fold of the bus. The test plays the kubelet (there is none:
pods are bound and started as they come, deletions confirmed) and the users: it pauses and
activates the experiment on the bus (as `experiment pause|activate` and the console do)
and reports a trial's validation metric as its SDK would, since no trial process runs.

The chain checked: Experiment -> ExperimentSubmitted (the watch) -> the searcher's create
decisions and JobRequests -> TrainingJobs <exp>-t<i> owned by the Experiment, their pods
running -> pause: the searcher's pause decisions and hold plans -> the jobs suspended, no
pod left -> activate: resume decisions -> the jobs running again -> the Experiment's
status follows all along -> the Experiment deleted: its kill -> the searcher's
JobDeletions -> no trial job left, and the Experiment itself gone.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import EXPERIMENTS, JOB_REQUESTS, SCALE_PLANS, TRIAL_DECISIONS
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from handlers.operator.kube import experiment
from handlers.operator.kube.client import KubeApi
from handlers.operator.kube.trainingjob import TRAINING_JOB
from schemas.experiments import (
    DecisionKind,
    ExperimentAction,
    ExperimentActionKind,
    TrialDecision,
    TrialMetrics,
    trial_job_name,
)
from schemas.plans import ScalePlan
from schemas.requests import JobDeletion, JobRequestResult, JobRequestStatus
from streams.searcher.runtime import service as searcher
from tests.integration.tap import Tap

from .kube import unique_name
from .test_experiments import (
    OPERATOR_SA,
    Experiments,
    experiment_body,
    experiment_crd,  # noqa: F401 (the fixture)
    experiments,  # noqa: F401 (the fixture)
    watching,
)
from .test_kube_testenv import apply_rbac, eventually_allowed, service_account_client
from .test_reconciler_support import Cluster, until

pytestmark = pytest.mark.integration

TRIALS = 2


@pytest.fixture
async def as_operator(
    cluster: Cluster,
    api: client.ApiClient,
    experiment_crd: str,  # noqa: F811
) -> AsyncIterator[Cluster]:
    """The cluster fixture (the kubelet played) with the reconciler's calls made as the
    operator's ServiceAccount, its Role in force."""
    await apply_rbac(api, cluster.namespace, "operator.yaml")
    sa = await service_account_client(api, cluster.namespace, OPERATOR_SA)
    async with sa:
        cluster.kube = KubeApi(sa, TRAINING_JOB, cluster.namespace)
        await eventually_allowed(lambda: cluster.kube.list_jobs())
        yield cluster


@pytest.fixture
async def tap(settings: Settings, env: str) -> AsyncIterator[Tap]:
    t = Tap(settings, env, (EXPERIMENTS, TRIAL_DECISIONS, JOB_REQUESTS, SCALE_PLANS))
    await t.start()
    try:
        yield t
    finally:
        await t.stop()


@pytest.fixture
async def searching(settings: Settings, env: str, pg_dsn: str) -> AsyncIterator[None]:
    """The env's searcher service, running until the test ends."""
    ctx = ServiceContext(settings, env, pg_dsn)
    task = asyncio.create_task(searcher.run(ctx))
    try:
        yield
    finally:
        ctx.stop.set()
        await asyncio.wait_for(task, 60)


def decisions(tap: Tap, name: str, kind: DecisionKind) -> list[TrialDecision]:
    return [d for d in tap.of(TrialDecision, name) if d.decision is kind]


async def trial_jobs(cluster: Cluster, name: str) -> dict[str, dict[str, Any]]:
    """The experiment's trial TrainingJobs, by name (its label)."""
    items, _ = await cluster.kube.list_jobs()
    return {
        j["metadata"]["name"]: j
        for j in items
        if (j["metadata"].get("labels") or {}).get(experiment.EXPERIMENT_LABEL) == name
    }


async def running_trials(cluster: Cluster, jobs: list[str], *, suspended: bool) -> bool:
    """Every job of ``jobs`` suspended without a pod, or running with its worker."""
    for job in jobs:
        view = await cluster.job(job)
        if view is None or view.suspended != suspended:
            return False
        pods = await cluster.pods(job)
        if suspended and pods:
            return False
        if not suspended and not await cluster.workers_running(job, 1):
            return False
    return True


async def test_an_experiment_creates_suspends_resumes_and_deletes_its_trial_jobs(
    settings: Settings,
    env: str,
    as_operator: Cluster,
    experiments: Experiments,  # noqa: F811
    tap: Tap,
    searching: None,
) -> None:
    cluster = as_operator
    namespace = cluster.namespace
    await cluster.start(env)
    name = unique_name("sweep")
    body = experiment_body(name)
    body["spec"]["searcher"] |= {"name": "random", "max_trials": TRIALS, "budget": {"max": 100}}
    async with (
        watching(settings, env, cluster.kube.api, namespace),
        Producer(settings) as producer,
    ):
        made = await experiments.create(body)
        uid = made["metadata"]["uid"]

        # the searcher creates its trials: TrainingJobs owned by the Experiment, running
        created = await tap.until(
            lambda: decisions(tap, name, DecisionKind.CREATE)[TRIALS - 1 :] and
            decisions(tap, name, DecisionKind.CREATE),
            f"{TRIALS} create decisions",
        )  # fmt: skip
        jobs = sorted(trial_job_name(name, d.trial or 0) for d in created)
        assert jobs == [trial_job_name(name, i) for i in range(TRIALS)]
        answers = await tap.until(
            lambda: (
                [r for r in tap.of(JobRequestResult) if r.name in jobs][TRIALS - 1 :]
                and [r for r in tap.of(JobRequestResult) if r.name in jobs]
            ),
            "the operator's answers",
        )
        assert {r.status for r in answers} == {JobRequestStatus.CREATED}, answers
        await until(lambda: running_trials(cluster, jobs, suspended=False), "trials running")
        for job, raw in (await trial_jobs(cluster, name)).items():
            assert raw["metadata"]["ownerReferences"] == [experiment.owner_reference(name, uid)]
            assert raw["metadata"]["labels"][experiment.EXPERIMENT_LABEL] == name, job
        got = await until(
            experiments.status(name, lambda s: (s.get("counts") or {}).get("running") == TRIALS),
            "the status showing the trials running",
        )
        assert got["status"]["phase"] == "Running"
        assert [t["job"] for t in got["status"]["trials"]] == jobs

        # paused: the searcher holds every trial, the operator suspends their jobs
        await producer.publish(
            ExperimentAction(
                env=env, source="user", experiment=name, action=ExperimentActionKind.PAUSE,
                reason="the cluster is needed",
            )
        )  # fmt: skip
        await tap.until(
            lambda: decisions(tap, name, DecisionKind.PAUSE)[TRIALS - 1 :], "pause decisions"
        )
        await until(lambda: running_trials(cluster, jobs, suspended=True), "trials suspended")
        held = [p for p in tap.of(ScalePlan) if p.job.name in jobs and p.suspend]
        assert {p.job.name for p in held} == set(jobs), held
        await until(experiments.status(name, lambda s: s.get("phase") == "Paused"), "phase Paused")

        # activated: the searcher resumes them, the operator starts their pods again
        await producer.publish(
            ExperimentAction(
                env=env, source="user", experiment=name, action=ExperimentActionKind.ACTIVATE
            )
        )
        await tap.until(
            lambda: decisions(tap, name, DecisionKind.RESUME)[TRIALS - 1 :], "resume decisions"
        )
        await until(lambda: running_trials(cluster, jobs, suspended=False), "trials resumed")

        # a trial reports (as its SDK would): the status shows the best trial
        await producer.publish(
            TrialMetrics(
                env=env, source="trial", experiment=name, trial=1, step=10, budget=10,
                validation=True, metrics={"val_loss": 0.25},
            )
        )  # fmt: skip
        got = await until(
            experiments.status(name, lambda s: (s.get("bestTrial") or {}).get("trial") == 1),
            "the best trial in the status",
        )
        assert got["status"]["phase"] == "Running"
        assert got["status"]["bestTrial"]["value"] == 0.25

        # deleted: the experiment is killed, its trial jobs deleted, the resource gone
        await experiments.delete(name)
        await until(experiments.gone(name), f"Experiment {name} gone")
        await tap.until(
            lambda: [e for e in tap.of(ExperimentAction, name) if e.action == "kill"],
            "the kill",
        )
        deletions = await tap.until(
            lambda: (
                [d for d in tap.of(JobDeletion) if d.name in jobs][TRIALS - 1 :]
                and [d for d in tap.of(JobDeletion) if d.name in jobs]
            ),
            "the searcher's JobDeletions",
        )
        assert {d.owner for d in deletions} == {name}
        await until(lambda: _none_left(cluster, name), "no trial job left")
        await tap.until(lambda: decisions(tap, name, DecisionKind.DONE), "the experiment done")


async def _none_left(cluster: Cluster, name: str) -> bool:
    return not await trial_jobs(cluster, name)
