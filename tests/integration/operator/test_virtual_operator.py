"""The virtual operator on real parts: submissions and plans in, the simulated cluster's
samples, node events and scale results out; each plan applied once, even across restarts."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid

import asyncpg
import pytest
import typer
from typer.testing import CliRunner

from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.errors import UserError
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from handlers.operator.virtual import operator as virtual
from handlers.operator.virtual.operator import ALREADY_APPLIED, SOURCE, VirtualOperator
from handlers.operator.virtual.settings import VirtualSettings
from handlers.operator.wiring.cli import operator
from handlers.simulator.cluster import GiB
from schemas.control import EnvMode
from schemas.jobs import (
    JobCompleted,
    JobStarted,
    NodeOOM,
    NodeStarted,
    OOMKind,
    RuntimeSample,
)
from schemas.plan_parts import AWAITING_JOB
from schemas.plans import (
    NodeGroupResource,
    NodeResource,
    ScaleResult,
    ScaleStatus,
    TrainingApplied,
)
from tests.conftest import REPO, EnvFactory
from tests.integration.operator.conftest import Sim

pytestmark = pytest.mark.integration


def results(sim: Sim, plan_id: str) -> list[ScaleResult]:
    return [r for r in sim.tap.of(ScaleResult) if r.plan_id == plan_id]


def samples(sim: Sim, job: str, workers: int) -> list[RuntimeSample]:
    return [s for s in sim.tap.of(RuntimeSample, job) if len(s.nodes) == workers]


def repeat_of(first: ScaleResult) -> str:
    return f"{ALREADY_APPLIED}: {first.reason}" if first.reason else ALREADY_APPLIED


async def plan_row(sim: Sim, plan_id: str) -> dict[str, object] | None:
    async with await EnvStore.open(sim.pg_dsn, sim.env, max_size=1) as store:
        rows = await store.fetch(
            "SELECT status, reason, applied_at FROM scale_plans WHERE plan_id = $1", plan_id
        )
    return dict(rows[0]) if rows else None


async def test_a_submitted_job_starts_and_reports_samples(sim: Sim) -> None:
    await sim.start()
    await sim.submit("job-a")
    sample = await sim.tap.until(
        lambda: next(iter(sim.tap.of(RuntimeSample, "job-a")), None), "runtime sample"
    )
    assert sample.source == SOURCE
    assert sample.env == sim.env
    assert [(n.type, n.id) for n in sample.nodes] == [("worker", 0)]
    assert sample.samples_per_s > 0
    started = sim.tap.of(NodeStarted, "job-a")
    assert [(e.node.type, e.node.id) for e in started] == [("worker", 0)]
    assert len(sim.tap.of(JobStarted, "job-a")) == 1
    # Simulated time: the job restarts (30 s) before its first sample, 30 s apart.
    later = await sim.tap.until(lambda: samples(sim, "job-a", 1)[2:] or None, "more samples")
    assert later[0].occurred_at > sample.occurred_at


async def test_scaling_workers_up_is_applied_and_trains_faster(sim: Sim) -> None:
    await sim.start()
    await sim.submit("job-b")
    before = await sim.tap.until(lambda: samples(sim, "job-b", 1) or None, "1-worker sample")
    await sim.producer.publish(
        sim.plan("job-b", "up-4", node_group_resources={"worker": NodeGroupResource(count=4)})
    )
    (result,) = await sim.tap.until(lambda: results(sim, "up-4") or None, "scale result")
    assert result.status is ScaleStatus.APPLIED
    assert result.key == "job-b"
    assert result.observed["worker"]["running"] == 4
    after = await sim.tap.until(lambda: samples(sim, "job-b", 4) or None, "4-worker sample")
    assert after[0].samples_per_s > before[0].samples_per_s
    assert after[0].occurred_at > before[0].occurred_at
    started = {e.node.id for e in sim.tap.of(NodeStarted, "job-b")}
    assert started == {0, 1, 2, 3}
    row = await plan_row(sim, "up-4")
    assert row is not None
    assert row["status"] == "applied"
    assert row["applied_at"] is not None


async def test_the_same_plan_applies_once_even_across_a_restart(sim: Sim) -> None:
    first = await sim.start()
    await sim.submit("job-c")
    await sim.tap.until(lambda: samples(sim, "job-c", 1) or None, "1-worker sample")
    plan = sim.plan("job-c", "twice", node_group_resources={"worker": NodeGroupResource(count=2)})
    again = plan.model_copy(update={"event_id": uuid.uuid4()})
    await sim.producer.publish(plan)
    await sim.producer.publish(again)
    answers = await sim.tap.until(
        lambda: results(sim, "twice")[1:] and results(sim, "twice"), "2 results"
    )
    assert [r.status for r in answers] == [ScaleStatus.APPLIED, ScaleStatus.APPLIED]
    assert answers[0].reason != ALREADY_APPLIED
    # a repeat says so, and what the first answer said
    assert answers[1].reason == repeat_of(answers[0])
    row = await plan_row(sim, "twice")
    assert row is not None
    assert row["status"] == "applied"
    applied_at = row["applied_at"]
    assert applied_at is not None

    # A new operator has a new, empty simulated cluster; the ledger still knows the plan.
    await first.stop()
    await sim.start()
    third = plan.model_copy(update={"event_id": uuid.uuid4()})
    await sim.producer.publish(third)
    answers = await sim.tap.until(
        lambda: results(sim, "twice")[2:] and results(sim, "twice"), "3rd result"
    )
    assert answers[2].status is ScaleStatus.APPLIED
    assert answers[2].reason == repeat_of(answers[0])
    row = await plan_row(sim, "twice")
    assert row is not None
    assert row["applied_at"] == applied_at
    started = [e.node.id for e in sim.tap.of(NodeStarted, "job-c")]
    assert sorted(started) == [0, 1]  # worker-1 started once: the plan took effect once


async def test_training_knobs_are_partial_until_the_job_confirms_them(sim: Sim) -> None:
    """The simulated operator cannot change a micro-batch either: it answers partial, and
    the simulated job says itself, on job.events, when it trains with the knobs."""
    await sim.start()
    await sim.submit("job-k")
    await sim.tap.until(lambda: samples(sim, "job-k", 1) or None, "1-worker sample")
    knobs = {"local_batch_size": 64, "accumulation_steps": 2}
    plan = sim.plan("job-k", "knobs", training=knobs)
    await sim.producer.publish(plan)
    (result,) = await sim.tap.until(lambda: results(sim, "knobs") or None, "scale result")
    assert result.status is ScaleStatus.PARTIAL
    assert [(p.part, p.reason) for p in result.not_applied] == [
        ("training.accumulation_steps", AWAITING_JOB),
        ("training.local_batch_size", AWAITING_JOB),
    ]
    (confirmed,) = await sim.tap.until(
        lambda: sim.tap.of(TrainingApplied, "job-k") or None, "training.applied"
    )
    assert (confirmed.plan_id, confirmed.training) == ("knobs", knobs)
    assert confirmed.source == SOURCE
    after = await sim.tap.until(
        lambda: [s for s in samples(sim, "job-k", 1) if s.local_batch_size == 64] or None,
        "a sample trained with the knobs",
    )
    assert after[0].occurred_at >= confirmed.occurred_at
    row = await plan_row(sim, "knobs")
    assert row is not None
    assert row["status"] == "partial" and row["applied_at"] is not None

    await sim.producer.publish(plan.model_copy(update={"event_id": uuid.uuid4()}))
    answers = await sim.tap.until(lambda: results(sim, "knobs")[1:] and results(sim, "knobs"), "2")
    assert answers[1].status is ScaleStatus.PARTIAL
    assert answers[1].not_applied == result.not_applied
    assert answers[1].reason == repeat_of(result)


async def test_a_plan_for_an_unknown_job_is_rejected_with_a_reason(sim: Sim) -> None:
    await sim.start()
    await sim.producer.publish(
        sim.plan("ghost", "for-ghost", node_group_resources={"worker": NodeGroupResource(count=2)})
    )
    (result,) = await sim.tap.until(lambda: results(sim, "for-ghost") or None, "scale result")
    assert result.status is ScaleStatus.REJECTED
    assert "unknown job 'ghost'" in result.reason
    assert result.observed == {}
    row = await plan_row(sim, "for-ghost")
    assert row is not None
    assert (row["status"], row["applied_at"]) == ("rejected", None)
    assert row["reason"] == result.reason


async def test_a_plan_with_too_little_memory_gives_a_host_oom(sim: Sim) -> None:
    await sim.start()
    await sim.submit("job-d")
    await sim.tap.until(lambda: samples(sim, "job-d", 1) or None, "1-worker sample")
    starve = NodeGroupResource(node_resource=NodeResource(memory=1 * GiB))
    await sim.producer.publish(sim.plan("job-d", "starve", node_group_resources={"worker": starve}))
    (oom,) = await sim.tap.until(lambda: sim.tap.of(NodeOOM, "job-d") or None, "node OOM")
    assert oom.kind is OOMKind.HOST_MEMORY
    assert oom.exit_code == 137
    assert (oom.node.type, oom.node.id) == ("worker", 0)
    assert oom.memory is not None
    assert oom.memory > 1 * GiB  # what it needed
    (result,) = results(sim, "starve")
    assert result.status is ScaleStatus.APPLIED


async def test_as_fast_as_possible_a_job_runs_to_completion(sim: Sim) -> None:
    await sim.start(fast=True)
    await sim.submit("job-e", application="cifar10")
    await sim.tap.until(lambda: sim.tap.of(JobCompleted, "job-e") or None, "job completion")
    steps = [s.global_step for s in sim.tap.of(RuntimeSample, "job-e")]
    assert len(steps) > 10
    assert steps == sorted(steps)
    times = [e.occurred_at for e in sim.tap.of(RuntimeSample, "job-e")]
    assert times == sorted(times)


async def test_a_second_operator_of_the_same_env_is_refused(sim: Sim) -> None:
    await sim.start()
    with pytest.raises(UserError, match="already runs env"):
        await sim.start()


async def test_the_virtual_operator_refuses_a_real_env(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    real = await EnvRegistry(settings, pg_dsn).real() or await make_env(mode=EnvMode.REAL)
    ctx = ServiceContext(settings, real.name, pg_dsn)
    with pytest.raises(UserError, match="only in virtual envs"):
        await virtual.run(ctx, {})
    with pytest.raises(UserError, match="only in virtual envs"):
        await VirtualOperator(settings, real.name, pg_dsn, VirtualSettings()).run(ctx.stop)
    assert not ctx.ready.is_set()


async def test_an_unknown_env_is_a_user_error(settings: Settings, pg_dsn: str) -> None:
    ctx = ServiceContext(settings, "no-such-env", pg_dsn)
    with pytest.raises(UserError, match="no env named 'no-such-env'"):
        await virtual.run(ctx, {})


def test_the_operator_modules_import_no_kubernetes_client() -> None:
    code = (
        "import sys, handlers.operator.wiring.cli, handlers.operator.wiring.service, "
        "handlers.operator.wiring.modes, handlers.operator.virtual.operator\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0].startswith('kubernetes')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


async def test_bad_options_are_user_errors(sim: Sim) -> None:
    with pytest.raises(UserError, match="speed"):
        await sim.start(speed=-1.0)
    with pytest.raises(UserError, match="unknown virtual operator option"):
        await sim.start(colour="blue")
    with pytest.raises(UserError, match="admission"):
        await sim.start(admission="anyone")
    with pytest.raises(UserError, match="holds no cluster credentials"):
        await sim.start(kubeconfig="/root/.kube/config")


def test_the_command_says_what_is_wrong_with_its_env(
    settings: Settings, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLROVER_EVENTS_BOOTSTRAP_SERVERS", settings.bootstrap_servers)
    monkeypatch.setenv("DLROVER_EVENTS_PG_DSN", pg_dsn)
    app = typer.Typer()
    app.command()(operator)
    result = CliRunner().invoke(app, ["--env", "no-such-env", "--speed", "10"])
    assert isinstance(result.exception, UserError)
    assert "no env named 'no-such-env'" in str(result.exception)
    # a name no env can have is refused by the option itself (a usage error, exit 2)
    result = CliRunner().invoke(app, ["--env", "Bad_Name"])
    assert result.exit_code == 2
    assert "env name 'Bad_Name' must match" in " ".join(result.output.split())


async def test_the_envs_own_settings_configure_its_operator(
    settings: Settings, pg_dsn: str
) -> None:
    registry = EnvRegistry(settings, pg_dsn)
    name = f"t{uuid.uuid4().hex[:10]}"
    with pytest.raises(UserError, match=r"operator\.speed"):  # refused at the door
        await registry.create(name, settings={"operator": {"speed": -1.0}})
    await registry.create(name, settings={"operator": {"speed": 0.5, "nodes": 3}})
    try:
        ctx = ServiceContext(settings, name, pg_dsn)
        task = asyncio.create_task(virtual.run(ctx, {"speed": 100.0}))  # options win
        await asyncio.wait_for(ctx.ready.wait(), 60)
        ctx.stop.set()
        await asyncio.wait_for(task, 30)
    finally:
        await registry.delete(name)
    bad = f"t{uuid.uuid4().hex[:10]}"
    await registry.create(bad)
    # settings the registry no longer takes, stored by an older version or by hand
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(
            "UPDATE dlrover.envs SET settings = $2::jsonb WHERE name = $1",
            bad,
            '{"operator": "fast please"}',
        )
    finally:
        await conn.close()
    try:
        with pytest.raises(UserError, match=f"env '{bad}': env setting operator: "):
            await virtual.run(ServiceContext(settings, bad, pg_dsn), {})
    finally:
        await registry.delete(bad)


async def test_answers_are_counted_by_status_with_their_latency(sim: Sim) -> None:
    running = await sim.start()
    registry = running.ctx.metrics

    def count(status: str) -> float:
        labels = {"env": sim.env, "platform": "virtual", "status": status}
        return registry.get_sample_value("dlrover_events_operator_plans_total", labels) or 0.0

    await sim.submit("job-m")
    await sim.tap.until(lambda: samples(sim, "job-m", 1) or None, "1-worker sample")
    up = sim.plan("job-m", "m-2", node_group_resources={"worker": NodeGroupResource(count=2)})
    await sim.producer.publish(up)
    await sim.producer.publish(
        sim.plan("ghost", "m-ghost", node_group_resources={"worker": NodeGroupResource(count=2)})
    )
    await sim.producer.publish(sim.plan("job-m", "m-knobs", training={"local_batch_size": 8}))
    await sim.tap.until(
        lambda: count("applied") == 1 and count("rejected") == 1 and count("partial") == 1,
        "one applied, one rejected and one partial answer counted",
    )
    latency = registry.get_sample_value(
        "dlrover_events_operator_apply_duration_seconds_count",
        {"env": sim.env, "platform": "virtual"},
    )
    assert latency == 3
    assert count("failed") == 0
