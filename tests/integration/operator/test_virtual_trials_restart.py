"""The virtual operator killed with SIGKILL in the middle of an experiment and started
again goes on with its trials: the searcher's inputs it had read and not taken, what it
had told the searcher and the answers to its requests are in its checkpoint (saved with
the request ledger's rows), so the experiment makes the same decisions as one whose
operator was never killed, and no trial is created twice."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import JOB_EVENTS, JOB_REQUESTS, TRIAL_DECISIONS, TRIAL_METRICS
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from schemas.experiments import DecisionKind, ExperimentSubmitted, TrialDecision
from schemas.jobs import JobSubmitted
from schemas.requests import JobRequestResult, JobRequestStatus
from streams.searcher.runtime.service import run as run_searcher
from tests.conftest import EnvFactory
from tests.integration.operator.processes import Service, operator_lock
from tests.integration.operator.test_virtual_trials import (
    OPERATOR,
    experiment_document,
    run_experiment,
)
from tests.integration.tap import DEADLINE_S, Tap

pytestmark = pytest.mark.integration

KILLS = 3


async def test_an_operator_killed_mid_experiment_goes_on_as_one_never_killed(
    settings: Settings, pg_dsn: str, make_env: EnvFactory, tmp_path: Path
) -> None:
    calm_env, killed_env = (await make_env()).name, (await make_env()).name
    calm = await run_experiment(settings, pg_dsn, calm_env, "sweep")

    nodes, gpus = str(OPERATOR["nodes"]), str(OPERATOR["gpus_per_node"])
    operator = Service(
        settings,
        pg_dsn,
        ["operator", "--env", killed_env, "--fast", "--nodes", nodes, "--gpus", gpus],
        tmp_path / "operator.log",
        lock_key=operator_lock(killed_env),
    )
    tap = Tap(settings, killed_env, (TRIAL_DECISIONS, TRIAL_METRICS, JOB_REQUESTS, JOB_EVENTS))
    await tap.start()
    stop = asyncio.Event()
    searcher = ServiceContext(settings, killed_env, pg_dsn, stop=stop)
    task = asyncio.create_task(run_searcher(searcher))
    rng = random.Random(7)
    try:
        await asyncio.wait_for(searcher.ready.wait(), DEADLINE_S)
        await operator.start()
        doc = experiment_document("sweep")
        async with Producer(settings) as producer:
            await producer.publish(
                ExperimentSubmitted(
                    env=killed_env, source="test", experiment="sweep", spec=doc.spec
                )
            )

        def decided() -> int:
            return len({d.seq for d in tap.of(TrialDecision)})

        def done() -> bool:
            operator.alive()
            return any(d.decision is DecisionKind.DONE for d in tap.of(TrialDecision))

        total = len(calm.decisions)
        for kill in range(KILLS):
            # a moment between the experiment's start and its end
            at = rng.randint(kill * total // (KILLS + 1) + 1, (kill + 1) * total // (KILLS + 1))

            def reached(at: int = at) -> bool:
                return decided() >= at or done()

            await tap.until(reached, f"{at} decisions")
            await asyncio.sleep(rng.uniform(0.0, 0.3))
            if done():
                break
            await operator.kill()
            await operator.start()
        await tap.until(done, "the experiment's done")
    finally:
        await operator.stop()
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
        await tap.stop()

    assert operator.kills == KILLS
    decisions = sorted(
        {
            (d.seq, d.decision.value, d.trial, d.budget, str(sorted(d.hparams.items())))
            for d in tap.of(TrialDecision)
        }
    )
    assert decisions == calm.decisions
    # each request answered one way, each trial's job submitted once under one uid
    answers: dict[str, set[tuple[str, str | None]]] = {}
    for r in tap.of(JobRequestResult):
        answers.setdefault(r.request_id, set()).add(
            (r.status.value, None if r.job is None else r.job.uuid)
        )
    creations = {k: v for k, v in answers.items() if not k.endswith("-del")}
    assert len(creations) == 8
    assert all(
        len(v) == 1 and next(iter(v))[0] == JobRequestStatus.CREATED for v in creations.values()
    )
    submitted: dict[str, set[str]] = {}
    for e in tap.of(JobSubmitted):
        submitted.setdefault(e.job.name, set()).add(e.job.uuid)
    assert sorted(submitted) == sorted(f"sweep-t{i}" for i in range(8))
    assert all(len(uids) == 1 for uids in submitted.values())
