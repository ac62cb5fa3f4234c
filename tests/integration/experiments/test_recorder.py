"""The experiments recorder on a real broker and Postgres: an experiment's submission, its
searcher's decisions and its trials' reports land in the env's tables, once each; its
status follows actions and ``done``; a record that does not decode is dead-lettered with
the reason; `describe` reads back what each trial was told and reported."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import DLQ, TRIAL_METRICS, topic
from dlrover_events.experiments.store import Batch, ExperimentNotFound, ExperimentStore
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from dlrover_events.store import create_pool, env_schema
from schemas.codec import decode, encode
from schemas.dlq import DeadLetter
from schemas.envelope import Event
from schemas.experiments import (
    DecisionKind,
    ExperimentAction,
    ExperimentActionKind,
    ExperimentSpec,
    ExperimentSubmitted,
    TrialDecision,
    TrialMetrics,
)
from streams.searcher import recorder
from tests.conftest import EnvFactory
from tests.unit.experiments.documents import document

pytestmark = pytest.mark.integration

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def submitted(env: str, name: str, t: float = 0.0) -> ExperimentSubmitted:
    spec = ExperimentSpec.model_validate(document(name)["spec"])
    return ExperimentSubmitted(env=env, experiment=name, spec=spec, occurred_at=at(t))


def told(
    env: str, name: str, seq: int, kind: DecisionKind, trial: int | None = None, **more: object
) -> TrialDecision:
    return TrialDecision.model_validate(
        {
            "env": env,
            "experiment": name,
            "seq": seq,
            "decision": kind,
            "trial": trial,
            "occurred_at": at(10 + seq),
            **more,
        }
    )


def report(
    env: str, name: str, trial: int, step: int, value: float, *, validation: bool = False
) -> TrialMetrics:
    metrics = {"val_loss": value} if validation else {"loss": value, "lr": 0.1}
    return TrialMetrics(
        env=env,
        experiment=name,
        trial=trial,
        step=step,
        budget=float(step),
        validation=validation,
        metrics=metrics,
        occurred_at=at(100 + step),
    )


@pytest.fixture
async def store(pg_dsn: str, make_env: EnvFactory) -> AsyncIterator[ExperimentStore]:
    env = (await make_env()).name
    pool = await create_pool(pg_dsn, env_schema(env), max_size=2)
    try:
        yield ExperimentStore(pool)
    finally:
        await pool.close()


def batch(events: Sequence[Event]) -> Batch:
    out = Batch()
    for event in events:
        out.add(event)
    return out


async def test_the_recorder_stores_what_it_reads_and_dead_letters_the_rest(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    name = "sweep"
    decisions = [
        told(env, name, 0, DecisionKind.CREATE, 0, hparams={"lr": 0.1}, budget=50, rung=0),
        told(env, name, 1, DecisionKind.CREATE, 1, hparams={"lr": 0.01}, budget=50, rung=0),
        told(env, name, 2, DecisionKind.PAUSE, 1, rung=0, reason="worse than the top 1/4"),
        told(env, name, 3, DecisionKind.RUN, 0, budget=200, rung=1, reason="promoted"),
    ]
    reports = [report(env, name, t, s, 1.0 / (s + 1) + t) for t in (0, 1) for s in range(1, 50)]
    reports += [
        report(env, name, 0, 50, 0.5, validation=True),
        report(env, name, 1, 50, 0.9, validation=True),
        report(env, name, 0, 200, 0.2, validation=True),
    ]
    async with Producer(settings) as producer:
        await producer.publish(submitted(env, name))
        await producer.publish_many([*decisions, *reports])
        await producer.send_raw(topic(env, TRIAL_METRICS), b"{not json", name.encode())
    tally = recorder.Tally()
    ctx = ServiceContext(settings, env, pg_dsn)
    running = asyncio.create_task(recorder.run(ctx, tally))
    pool = await create_pool(pg_dsn, env_schema(env), max_size=2)
    try:
        letters: list[Event] = []
        async with asyncio.timeout(60):
            while tally.metrics < len(reports) or tally.decisions < len(decisions) or not letters:
                await asyncio.sleep(0.2)
                records = await read_topic(settings, topic(env, DLQ))
                letters = [decode(r.value) for r in records if r.value]
        store = ExperimentStore(pool)
        seen = await store.describe(name)
    finally:
        ctx.stop.set()
        await running
        await pool.close()
    assert (tally.experiments, tally.decisions, tally.metrics) == (1, 4, len(reports))
    assert seen["status"] == "active" and seen["spec"]["searcher"]["name"] == "asha"
    first, second = seen["trials"]
    assert (first["status"], first["budget"], first["rung"], first["hparams"]) == (
        "running",
        200,
        1,
        {"lr": 0.1},
    )
    assert (first["last_value"], first["best_value"], first["validations"]) == (0.2, 0.2, 2)
    assert (first["step"], first["budget_used"]) == (200, 200)
    assert (second["status"], second["rung"], second["best_value"]) == ("paused", 0, 0.9)
    assert [d["decision"] for d in second["decisions"]] == ["create", "pause"]
    assert second["decisions"][1]["reason"] == "worse than the top 1/4"
    assert seen["best_trial"] == {"trial": 0, "value": 0.2, "hparams": {"lr": 0.1}}
    assert seen["ranking"] == [0, 1]
    assert [(r["rung"], r["trials"]) for r in seen["rungs"]] == [(0, [0, 1]), (1, [0])]
    bad = [x for x in letters if isinstance(x, DeadLetter)]
    assert len(bad) == 1 and bad[0].consumer_group == f"{env}.{recorder.GROUP}"
    assert bad[0].error_kind.value == "malformed" and bad[0].error


async def test_a_batch_stored_twice_adds_nothing(store: ExperimentStore) -> None:
    env, name = "e", "twice"
    events: list[Event] = [
        submitted(env, name),
        told(env, name, 0, DecisionKind.CREATE, 0, budget=10, rung=0),
        *(report(env, name, 0, s, 1.0) for s in range(5)),
    ]
    first = await store.record(batch(events))
    again = await store.record(batch(events))
    assert (first.experiments, first.decisions, first.metrics) == (1, 1, 5)
    assert (again.experiments, again.decisions, again.metrics) == (0, 0, 0)
    assert len(await store.trial_metrics(name, 0)) == 5
    # a trial that reported before any decision about it was stored: listed, status unknown
    await store.record(batch([report(env, name, 5, 1, 0.5, validation=True)]))
    trials = (await store.describe(name))["trials"]
    assert [(t["trial"], t["status"], t["best_value"]) for t in trials] == [
        (0, "running", None),
        (5, "unknown", 0.5),
    ]
    # a second submission of the name keeps the first spec (as the searcher does)
    other = submitted(env, name)
    other.spec.searcher.metric = "accuracy"
    await store.record(batch([other]))
    assert (await store.describe(name))["metric"] == "val_loss"


async def test_status_follows_actions_and_done(store: ExperimentStore) -> None:
    env = "e"

    def action(name: str, kind: ExperimentActionKind, t: float) -> ExperimentAction:
        return ExperimentAction(env=env, experiment=name, action=kind, occurred_at=at(t))

    await store.record(batch([submitted(env, "a"), submitted(env, "b"), submitted(env, "c")]))
    await store.record(batch([action("a", ExperimentActionKind.PAUSE, 1)]))
    assert await store.status("a") == "paused"
    await store.record(batch([action("a", ExperimentActionKind.ACTIVATE, 2)]))
    assert await store.status("a") == "active"
    done = told(env, "a", 0, DecisionKind.DONE, reason="max_trials reached")
    await store.record(batch([done, action("a", ExperimentActionKind.KILL, 100)]))
    assert await store.status("a") == "completed"  # killed after it ended: still completed
    described = await store.describe("a")
    assert described["status_reason"] == "max_trials reached"
    assert [d["decision"] for d in described["decisions"]] == ["done"]
    # a kill, then the searcher's done: killed
    await store.record(batch([action("b", ExperimentActionKind.KILL, 1)]))
    await store.record(batch([told(env, "b", 0, DecisionKind.DONE, reason="killed")]))
    assert await store.status("b") == "killed"
    refused = told(env, "c", 0, DecisionKind.DONE, reason="refused: unknown searcher 'x'")
    await store.record(batch([refused]))
    assert await store.status("c") == "refused"
    # an action on an experiment nobody submitted makes none
    await store.record(batch([action("ghost", ExperimentActionKind.PAUSE, 1)]))
    assert not await store.exists("ghost")
    with pytest.raises(ExperimentNotFound, match="no experiment named 'ghost'"):
        await store.describe("ghost")


async def test_a_done_read_before_its_submission_is_kept(store: ExperimentStore) -> None:
    env = "e"
    await store.record(batch([told(env, "early", 0, DecisionKind.DONE, reason="no trials")]))
    assert await store.status("early") == "completed"
    await store.record(batch([submitted(env, "early")]))
    seen = await store.describe("early")
    assert (seen["status"], seen["searcher"]) == ("completed", "asha")
    assert seen["submitted_at"] is not None


async def test_list_counts_trials_and_finds_the_best(store: ExperimentStore) -> None:
    env = "e"
    bigger = submitted(env, "acc")
    bigger.spec.searcher.metric, bigger.spec.searcher.smaller_is_better = "acc", False
    events: list[Event] = [
        submitted(env, "loss", t=1),
        bigger,
        *(told(env, "loss", i, DecisionKind.CREATE, i, budget=10) for i in range(3)),
        told(env, "acc", 0, DecisionKind.CREATE, 0, budget=10),
        told(env, "acc", 1, DecisionKind.CREATE, 1, budget=10),
        report(env, "loss", 0, 10, 0.7, validation=True),
        report(env, "loss", 2, 10, 0.3, validation=True),
        report(env, "loss", 1, 10, 0.1),  # training: not a validation value
        TrialMetrics(
            env=env, experiment="acc", trial=0, step=5, budget=5, validation=True,
            metrics={"acc": 0.6},
        ),
        TrialMetrics(
            env=env, experiment="acc", trial=1, step=5, budget=5, validation=True,
            metrics={"acc": 0.8, "other": 0.0},
        ),
    ]  # fmt: skip
    await store.record(batch(events))
    rows = {r["name"]: r for r in await store.experiments()}
    assert [r["name"] for r in await store.experiments()] == ["loss", "acc"]  # newest first
    assert (rows["loss"]["trials"], rows["loss"]["best_trial"], rows["loss"]["best_value"]) == (
        3,
        2,
        0.3,
    )
    assert (rows["acc"]["trials"], rows["acc"]["best_trial"], rows["acc"]["best_value"]) == (
        2,
        1,
        0.8,
    )
    assert rows["acc"]["smaller_is_better"] is False


async def test_an_event_postgres_cannot_store_is_dead_lettered_and_the_rest_stored(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    """A decision whose hyperparameter holds a NUL (which jsonb cannot store, and which the
    contract refuses since) sent as raw bytes by a producer that skips the contract: that
    one record goes to the DLQ with the contract's reason, the others of its batch are
    stored."""
    env = (await make_env()).name
    valid = told(env, "nul", 0, DecisionKind.CREATE, 0, hparams={"act": "relu"}, budget=5)
    bad = encode(valid).replace(b'"relu"', b'"re\\u0000lu"')
    good = [report(env, "nul", 0, s, 1.0) for s in range(1, 4)]
    async with Producer(settings) as producer:
        await producer.publish_many(good)
        await producer.send_raw(topic(env, "trial.decisions"), bad, b"nul")
    tally = recorder.Tally()
    ctx = ServiceContext(settings, env, pg_dsn)
    running = asyncio.create_task(recorder.run(ctx, tally))
    try:
        letters: list[Event] = []
        async with asyncio.timeout(60):
            while tally.metrics < len(good) or not letters:
                await asyncio.sleep(0.2)
                records = await read_topic(settings, topic(env, DLQ))
                letters = [decode(r.value) for r in records if r.value]
    finally:
        ctx.stop.set()
        await running
    [letter] = letters
    assert isinstance(letter, DeadLetter) and letter.error_kind.value != "handler"
    assert letter.original_topic == topic(env, "trial.decisions")
    assert "NUL" in letter.error, letter.error
    assert tally.decisions == 0 and tally.metrics == len(good)
