"""The searcher on a real broker and Postgres (streams/searcher/runtime): an experiment
(random, 3 trials, 2 at once) submitted, the test playing the operator (JobRequestResults)
and the trials (TrialMetrics) and a user (pause, activate); its decisions, job requests
and hold plans are those an uninterrupted pure run of the same inputs makes (the same
events, ids and all). Killed with SIGKILL after a batch was checkpointed but not
published, or published but not committed, a searcher started again publishes each
decision, request and plan exactly once, and the same ones.

The inputs go one step at a time, each once the decisions of the one before are out, as
the operator and the trials would: the order the searcher reads them in is then the
order the pure run takes them in."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import (
    DLQ,
    EXPERIMENTS,
    JOB_REQUESTS,
    SCALE_PLANS,
    TRIAL_DECISIONS,
    topic,
)
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from schemas.dlq import DeadLetter, FailureKind
from schemas.envelope import Event
from schemas.experiments import (
    ExperimentAction,
    ExperimentActionKind,
    ExperimentSpec,
    ExperimentSubmitted,
    TrialDecision,
    TrialMetrics,
)
from schemas.jobs import JobMeta
from schemas.plans import ScalePlan
from schemas.requests import JobRequest, JobRequestResult, JobRequestStatus
from streams.searcher import trials
from streams.searcher.runtime.service import run
from streams.searcher.runtime.step import SOURCE, Experiment, start, step
from tests.conftest import REPO, EnvFactory, cli_environ
from tests.integration.tap import DEADLINE_S, Tap

pytestmark = pytest.mark.integration

EXP = "sweep"
T0 = datetime(2025, 1, 1, tzinfo=UTC)
OUTPUTS = (TRIAL_DECISIONS, JOB_REQUESTS, SCALE_PLANS, DLQ)


def spec() -> ExperimentSpec:
    return ExperimentSpec.model_validate(
        {
            "hyperparameters": {
                "lr": {"type": "log", "minval": -4, "maxval": -1},
                "width": {"type": "int", "minval": 8, "maxval": 64},
            },
            "searcher": {
                "name": "random",
                "metric": "val_loss",
                "max_trials": 3,
                "max_concurrent_trials": 2,
                "budget": {"unit": "steps", "max": 100},
                "seed": 7,
            },
            "trial": {
                "metadata": {"labels": {"dlrover-events.io/app": "mlp"}},
                "spec": {
                    "roles": {
                        "worker": {
                            "replicas": 1,
                            "template": {"spec": {"containers": [{"name": "main"}]}},
                        }
                    }
                },
            },
        }
    )


def job(trial: int) -> JobMeta:
    labels = {trials.EXPERIMENT_LABEL: EXP, trials.TRIAL_LABEL: str(trial)}
    return JobMeta(uuid=f"uid-{trial}", name=f"{EXP}-t{trial}", labels=labels)


class Script:
    """The inputs of one experiment's life, each step with the number of decisions made
    once it is decided; every event made once, so a publication again is the same event."""

    def __init__(self, env: str) -> None:
        self.env = env
        self._n = 0
        k = ExperimentActionKind
        self.steps: list[tuple[list[Event], int]] = [
            (
                [ExperimentSubmitted(env=env, experiment=EXP, spec=spec(), occurred_at=self._at())],
                2,
            ),
            ([self.created(0), self.created(1)], 2),
            ([self.report(0, 0.5)], 4),
            ([self.action(k.PAUSE)], 6),
            ([self.created(2)], 6),
            ([self.action(k.ACTIVATE)], 8),
            ([self.report(1, 0.3)], 9),
            ([self.report(2, 0.4)], 11),
        ]

    def _at(self) -> datetime:
        self._n += 1
        return T0 + timedelta(seconds=self._n)

    def created(self, trial: int) -> JobRequestResult:
        return JobRequestResult(
            env=self.env,
            source="kube-operator",
            request_id=f"{EXP}-t{trial}",
            name=f"{EXP}-t{trial}",
            status=JobRequestStatus.CREATED,
            reason="created on the local platform",
            job=job(trial),
            owner=EXP,
            requester=SOURCE,
            occurred_at=self._at(),
        )

    def report(self, trial: int, value: float) -> TrialMetrics:
        return TrialMetrics(
            env=self.env,
            experiment=EXP,
            trial=trial,
            step=100,
            budget=100,
            validation=True,
            metrics={"val_loss": value},
            occurred_at=self._at(),
        )

    def action(self, kind: ExperimentActionKind) -> ExperimentAction:
        return ExperimentAction(env=self.env, experiment=EXP, action=kind, occurred_at=self._at())

    def uninterrupted(self) -> list[Event]:
        """What a searcher that never stops publishes for these inputs: the pure run."""
        experiment: Experiment | None = None
        out: list[Event] = []
        for inputs, _ in self.steps:
            for event in inputs:
                if experiment is None:
                    assert isinstance(event, ExperimentSubmitted)
                    experiment, made = start(event)
                else:
                    experiment, made = step(experiment, event)
                out.extend(made)
        return out


def decisions(tap: Tap) -> dict[int, list[TrialDecision]]:
    by_seq: dict[int, list[TrialDecision]] = {}
    for d in tap.of(TrialDecision):
        if d.experiment == EXP:
            by_seq.setdefault(d.seq, []).append(d)
    return by_seq


async def play(
    script: Script,
    producer: Producer,
    tap: Tap,
    *,
    on_wait: Callable[[], Any] | None = None,
) -> None:
    """Each step's inputs published once the step before is decided."""
    for inputs, expected in script.steps:
        await producer.publish_many(inputs)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE_S
        while len(decisions(tap)) < expected:
            if loop.time() > deadline:
                seen = sorted(decisions(tap))
                pytest.fail(f"{expected} decisions not made within {DEADLINE_S:.0f} s: {seen}")
            if on_wait is not None:
                await on_wait()
            await asyncio.sleep(0.05)


def published_once_each(tap: Tap, expected: list[Event]) -> None:
    """Every decision, request and plan the uninterrupted run makes is on the bus once,
    as it made it; nothing else is."""
    want = {e.event_id: e for e in expected}
    mine = [
        e
        for e in tap.events
        if isinstance(e, TrialDecision | JobRequest | ScalePlan) and e.source == SOURCE
    ]
    ids = [e.event_id for e in mine]
    assert len(ids) == len(set(ids)), "an event published twice"
    assert set(ids) == set(want), (sorted(map(str, set(want) - set(ids))), len(ids))
    for event in mine:
        assert event.model_dump(mode="json") == want[event.event_id].model_dump(mode="json")
    # one document per request id, one plan per plan id, one decision per seq
    requests = [e for e in mine if isinstance(e, JobRequest)]
    assert sorted(r.request_id for r in requests) == [f"{EXP}-t{i}" for i in range(3)]
    plans = [e for e in mine if isinstance(e, ScalePlan)]
    assert len({p.plan_id for p in plans}) == len(plans) == 4
    assert sorted(decisions(tap)) == list(range(11))


@contextlib.asynccontextmanager
async def searcher(settings: Settings, env: str, pg_dsn: str) -> AsyncIterator[ServiceContext]:
    """The searcher service of ``env``, in this process, until the block ends."""
    ctx = ServiceContext(settings, env, pg_dsn)
    task = asyncio.create_task(run(ctx))
    try:
        async with asyncio.timeout(DEADLINE_S):
            while not ctx.ready.is_set():
                assert not task.done(), task
                await asyncio.sleep(0.05)
        yield ctx
    finally:
        ctx.stop.set()
        await asyncio.wait_for(task, DEADLINE_S)


async def stored(pg_dsn: str, env: str) -> tuple[int, int]:
    """Experiments checkpointed, and events left in the outbox."""
    async with await EnvStore.open(pg_dsn, env, max_size=1) as store:
        states = await store.pool.fetchval("SELECT count(*) FROM searcher_state")
        left = await store.pool.fetchval("SELECT count(*) FROM searcher_outbox")
    return int(states), int(left)


async def test_an_experiment_s_decisions_and_effects(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    script = Script(env)
    tap = Tap(settings, env, OUTPUTS)
    await tap.start()
    try:
        async with Producer(settings) as producer, searcher(settings, env, pg_dsn):
            # what the searcher does not decide on: bytes that are no event (dead-lettered
            # by its consumer, with why), another requester's answer for a trial's name
            await producer.send_raw(topic(env, EXPERIMENTS), b"{not json", EXP.encode())
            stranger = script.created(0).model_copy(
                update={"requester": "someone", "job": JobMeta(uuid="not-ours", name="sweep-t0")}
            )
            await producer.publish(stranger)
            await play(script, producer, tap)

            letter = await tap.until(
                lambda: next(
                    (d for d in tap.of(DeadLetter) if d.consumer_group == f"{env}.searcher"),
                    None,
                ),
                "the searcher's dead letter",
            )
            assert letter.error_kind == FailureKind.MALFORMED
            assert letter.original_topic == topic(env, EXPERIMENTS)

        expected = script.uninterrupted()
        published_once_each(tap, expected)
        # the plans name the jobs the operator created, not the stranger's
        plans = tap.of(ScalePlan)
        assert {p.job.uuid for p in plans} == {"uid-1", "uid-2"}
        for name in ("sweep-t1", "sweep-t2"):  # in order on the job's partition
            assert [p.hold for p in plans if p.job.name == name] == [True, False]
        # a trial's job as the operator is asked for it
        [request] = [r for r in tap.of(JobRequest) if r.name == "sweep-t2"]
        assert request.owner == EXP and request.source == SOURCE
        assert request.document["metadata"]["labels"]["dlrover-events.io/app"] == "mlp"
        [done] = decisions(tap)[10]
        assert done.decision.value == "done" and "best: trial 1" in done.reason
        assert await stored(pg_dsn, env) == (1, 0)
    finally:
        await tap.stop()


@pytest.mark.parametrize(("point", "die_at"), [("decided", 4), ("published", 6)])
async def test_a_searcher_killed_resumes_without_a_trial_twice(
    settings: Settings, pg_dsn: str, make_env: EnvFactory, point: str, die_at: int
) -> None:
    """SIGKILLed once it made ``die_at`` decisions, at ``point`` of its batch; another
    searcher takes over: the same decisions and effects, each published once."""
    env = (await make_env()).name
    script = Script(env)
    tap = Tap(settings, env, OUTPUTS)
    await tap.start()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.integration.experiments.crash_searcher",
        settings.bootstrap_servers,
        pg_dsn,
        env,
        str(die_at),
        point,
        cwd=REPO,
        env=cli_environ(settings, pg_dsn),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    said = asyncio.create_task(proc.stdout.read())  # read as it comes: a full pipe blocks
    restarted = contextlib.AsyncExitStack()
    took_over: list[ServiceContext] = []

    async def take_over() -> None:
        if proc.returncode is None or took_over:
            return
        took_over.append(await restarted.enter_async_context(searcher(settings, env, pg_dsn)))

    try:
        async with Producer(settings) as producer:
            await play(script, producer, tap, on_wait=take_over)
        assert proc.returncode == -9, "the first searcher was to be killed"
        output = (await said).decode()
        assert f"dying at {point}" in output, output
        # the batch it died in was read again by the next searcher, and skipped: its
        # checkpoint had it
        [ctx] = took_over
        skipped = ctx.metrics.get_sample_value(
            "dlrover_events_searcher_skipped_total", {"env": env}
        )
        assert skipped is not None and skipped >= 1, skipped
        published_once_each(tap, script.uninterrupted())
    finally:
        await restarted.aclose()
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        said.cancel()
        await tap.stop()
    assert await stored(pg_dsn, env) == (1, 0)
