"""An experiment in a virtual env, end to end on the real broker and Postgres: the real
searcher (streams/searcher/runtime) asks for trials, the virtual operator answers its
requests by the reconciler's rules and simulates each trial along the built-in learning
curve at the Pollux speed of its gang, holds and releases them on the searcher's plans,
and the experiment ends. Run twice in two envs, it makes the same decisions (the
simulated clock waits for the searcher), and a request delivered again gets its first
answer."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import JOB_EVENTS, JOB_REQUESTS, TRIAL_DECISIONS, TRIAL_METRICS
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from handlers.operator.wiring.modes import run_operator
from schemas.experiments import (
    DecisionKind,
    ExperimentAction,
    ExperimentActionKind,
    ExperimentDocument,
    ExperimentSubmitted,
    TrialDecision,
    TrialMetrics,
)
from schemas.jobs import JobCompleted, JobHeld, JobSubmitted
from schemas.requests import JobRequest, JobRequestResult, JobRequestStatus
from streams.searcher.recorder import run as run_recorder
from streams.searcher.runtime.service import run as run_searcher
from tests.conftest import EnvFactory
from tests.integration.tap import DEADLINE_S, Tap
from tests.unit.experiments.documents import document

pytestmark = pytest.mark.integration

#: A small ASHA experiment: 8 trials, 4 at a time, rungs at 10, 40 and 160 steps.
SEARCHER: dict[str, Any] = {
    "name": "asha",
    "max_trials": 8,
    "max_concurrent_trials": 4,
    "budget": {"unit": "steps", "max": 160},
    "divisor": 4,
    "max_rungs": 3,
    "mode": "aggressive",
    "seed": 11,
}
OPERATOR: dict[str, Any] = {"fast": True, "nodes": 1, "gpus_per_node": 4}


def experiment_document(name: str) -> ExperimentDocument:
    doc = document(name, **SEARCHER)
    worker = doc["spec"]["trial"]["spec"]["roles"]["worker"]
    worker["resources"] = {"cpu": 1, "memory": "4Gi", "nvidia.com/gpu": 1}
    doc["spec"]["trial"] |= {
        "apiVersion": "dlrover-events.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"labels": {"dlrover-events.io/app": "cifar10"}},
    }
    return ExperimentDocument.model_validate(doc)


@dataclass
class Run:
    decisions: list[tuple[int, str, int | None, float | None, str]]
    tap: Tap


async def run_experiment(
    settings: Settings,
    pg_dsn: str,
    env: str,
    name: str,
    *,
    operator_options: dict[str, Any] | None = None,
    record: bool = False,
) -> Run:
    """The experiment in ``env`` with its operator and searcher running (and, with
    ``record``, its experiments recorder), to its done."""
    tap = Tap(settings, env, (TRIAL_DECISIONS, TRIAL_METRICS, JOB_REQUESTS, JOB_EVENTS))
    trials = {f"{name}-t{i}" for i in range(8)}
    await tap.start()
    stop = asyncio.Event()
    operator = ServiceContext(settings, env, pg_dsn, stop=stop)
    searcher = ServiceContext(settings, env, pg_dsn, stop=stop)
    recorder = ServiceContext(settings, env, pg_dsn, stop=stop)
    tasks = [
        asyncio.create_task(run_operator(operator, {**OPERATOR, **(operator_options or {})})),
        asyncio.create_task(run_searcher(searcher)),
    ]
    contexts = [operator, searcher]
    if record:
        tasks.append(asyncio.create_task(run_recorder(recorder)))
        contexts.append(recorder)
    try:
        for ctx in contexts:
            await asyncio.wait_for(ctx.ready.wait(), DEADLINE_S)
        doc = experiment_document(name)
        async with Producer(settings) as producer:
            await producer.publish(
                ExperimentSubmitted(env=env, source="test", experiment=name, spec=doc.spec)
            )

        def done() -> bool:
            for task in tasks:
                if task.done():
                    task.result()  # a service that stopped says why
            return any(d.decision is DecisionKind.DONE for d in tap.of(TrialDecision))

        await tap.until(done, "the experiment's done")
        if record:
            # until the recorder has stored every validation report it will be asked for
            reports = {m.event_id for m in tap.of(TrialMetrics) if m.validation}
            store = await EnvStore.open(pg_dsn, env, max_size=1)
            try:

                async def stored() -> int:
                    return int(
                        await store.pool.fetchval(
                            "SELECT count(*) FROM trial_metrics WHERE validation"
                        )
                    )

                for _ in range(int(DEADLINE_S / 0.2)):
                    if await stored() >= len(reports):
                        break
                    await asyncio.sleep(0.2)
                else:
                    pytest.fail(f"the recorder stored {await stored()} of {len(reports)} reports")
            finally:
                await store.close()
        # the operator takes the done at its clock's next stop: every trial's job ends
        await tap.until(
            lambda: len({e.job.name for e in tap.of(JobCompleted)} & trials) == 8,
            "every trial's job.completed",
        )
        decisions = sorted(
            {
                (d.seq, d.decision.value, d.trial, d.budget, str(sorted(d.hparams.items())))
                for d in tap.of(TrialDecision)
            }
        )
        return Run(decisions, tap)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await tap.stop()


async def test_an_asha_experiment_runs_on_simulated_trials_the_same_twice(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    first_env, second_env = (await make_env()).name, (await make_env()).name
    first = await run_experiment(settings, pg_dsn, first_env, "sweep")
    tap = first.tap
    kinds = [kind for _, kind, *_ in first.decisions]
    assert kinds.count("create") == 8
    assert {"pause", "resume", "done"} <= set(kinds) or {"run", "done"} <= set(kinds)
    # every decision once, numbered from 0
    assert [seq for seq, *_ in first.decisions] == list(range(len(first.decisions)))
    # every trial was created once, by the operator, with its job.submitted
    results = [r for r in tap.of(JobRequestResult) if r.status is JobRequestStatus.CREATED]
    assert sorted({r.name for r in results}) == [f"sweep-t{i}" for i in range(8)]
    submitted = [e for e in tap.of(JobSubmitted) if e.job.name.startswith("sweep-t")]
    assert sorted(e.job.name for e in submitted) == [f"sweep-t{i}" for i in range(8)]
    assert all(e.application == "cifar10" for e in submitted)
    # a trial reports at the budgets it was given, from the built-in curve
    reports = [m for m in tap.of(TrialMetrics) if m.validation]
    assert {m.budget for m in reports} <= {10.0, 40.0, 160.0}
    assert all("val_loss" in m.metrics for m in reports)
    # held trials were held and released by plans; every trial's job ended
    held = tap.of(JobHeld)
    if any(kind == "pause" for kind in kinds):
        assert any(h.held for h in held)
    ended = {e.job.name for e in tap.of(JobCompleted)}
    assert ended == {f"sweep-t{i}" for i in range(8)}

    second = await run_experiment(settings, pg_dsn, second_env, "sweep")
    assert second.decisions == first.decisions


async def test_a_request_delivered_again_gets_its_first_answer(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    tap = Tap(settings, env, (JOB_REQUESTS, JOB_EVENTS))
    await tap.start()
    stop = asyncio.Event()
    ctx = ServiceContext(settings, env, pg_dsn, stop=stop)
    task = asyncio.create_task(run_operator(ctx, OPERATOR))
    try:
        await asyncio.wait_for(ctx.ready.wait(), DEADLINE_S)
        doc = experiment_document("solo")
        template = {
            **doc.spec.trial,
            "metadata": {"name": "solo-t0", "labels": {"dlrover-events.io/app": "cifar10"}},
        }
        request = JobRequest(
            env=env,
            source="test",
            request_id="solo-t0",
            name="solo-t0",
            owner="solo",
            document=template,
        )
        other = request.model_copy(update={"request_id": "someone-else", "owner": None})
        async with Producer(settings) as producer:
            await producer.publish(request)
            await producer.publish(request)
            await producer.publish(other)

        def answers() -> list[JobRequestResult] | None:
            found = tap.of(JobRequestResult)
            return found if len(found) >= 3 else None

        first, again, theirs = await tap.until(answers, "three answers")
        assert first.status is JobRequestStatus.CREATED and first.job is not None
        assert again.status is JobRequestStatus.CREATED and again.job == first.job
        assert again.reason.startswith("already answered")
        assert theirs.status is JobRequestStatus.EXISTS
        # an ordinary job (no trial variables) created once, run as the workload's jobs
        await tap.until(lambda: tap.of(JobSubmitted), "its job.submitted")
        assert [e.job.uuid for e in tap.of(JobSubmitted)] == [first.job.uuid]
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
        await tap.stop()


async def test_curves_recorded_in_one_env_replay_in_another(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    """(b) of the curves: an experiment's trial_metrics, stored by the recorder in its
    env's Postgres, are the curves of another env's trials (operator.trials.curves kind
    recorded): the same experiment there reports the recorded values and decides the same."""
    source, replay = (await make_env()).name, (await make_env()).name
    recorded = await run_experiment(settings, pg_dsn, source, "sweep", record=True)
    curves = {"kind": "recorded", "env": source, "experiment": "sweep"}
    replayed = await run_experiment(
        settings, pg_dsn, replay, "sweep", operator_options={"trials": {"curves": curves}}
    )
    assert replayed.decisions == recorded.decisions

    def values(run: Run) -> dict[tuple[int, float], float]:
        return {
            (m.trial, m.budget): m.metrics["val_loss"]
            for m in run.tap.of(TrialMetrics)
            if m.validation
        }

    assert values(replayed) == values(recorded)


async def test_a_killed_experiments_trials_are_deleted(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    """An experiment killed while its trials run: the searcher stops them and asks for
    their jobs' deletion, the operator ends them and deletes them (owner-checked, answered
    deleted), and the experiment ends."""
    env = (await make_env()).name
    tap = Tap(settings, env, (TRIAL_DECISIONS, JOB_REQUESTS, JOB_EVENTS))
    await tap.start()
    stop = asyncio.Event()
    operator = ServiceContext(settings, env, pg_dsn, stop=stop)
    searcher = ServiceContext(settings, env, pg_dsn, stop=stop)
    tasks = [
        asyncio.create_task(run_operator(operator, OPERATOR)),
        asyncio.create_task(run_searcher(searcher)),
    ]
    try:
        for ctx in (operator, searcher):
            await asyncio.wait_for(ctx.ready.wait(), DEADLINE_S)
        doc = experiment_document("doomed")
        async with Producer(settings) as producer:
            await producer.publish(
                ExperimentSubmitted(env=env, source="test", experiment="doomed", spec=doc.spec)
            )
            await tap.until(
                lambda: (
                    len(
                        [
                            r
                            for r in tap.of(JobRequestResult)
                            if r.status is JobRequestStatus.CREATED
                        ]
                    )
                    >= 4
                ),
                "four trials created",
            )
            await producer.publish(
                ExperimentAction(
                    env=env, source="test", experiment="doomed", action=ExperimentActionKind.KILL
                )
            )

        def deleted() -> set[str]:
            return {
                r.name for r in tap.of(JobRequestResult) if r.status is JobRequestStatus.DELETED
            }

        created = {r.name for r in tap.of(JobRequestResult) if r.status is JobRequestStatus.CREATED}
        await tap.until(lambda: deleted() >= created, "every created trial deleted")
        await tap.until(
            lambda: any(d.decision is DecisionKind.DONE for d in tap.of(TrialDecision)),
            "the experiment's done",
        )
        # stopped first (their processes exit 0 on stop), then deleted
        await tap.until(
            lambda: {e.job.name for e in tap.of(JobCompleted)} >= created,
            "every created trial's job.completed",
        )
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await tap.stop()
