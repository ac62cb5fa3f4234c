"""The real operator follows the real env on dlrover.control: promotion moves it to the new
real env without a restart, and the demoted env's plans no longer reach the cluster.

The session has one real env at most: the test uses the one there is (or makes one) and
promotes it back at the end, as tests/integration/test_promote.py does.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from handlers.operator.kube.cluster import KubeCluster
from handlers.operator.kube.runner import RealOperator, connect, kube_settings
from handlers.operator.wiring.modes import run_operator
from schemas.control import EnvMode
from schemas.plans import NodeGroupResource, ScaleResult, ScaleStatus
from tests.conftest import EnvFactory
from tests.integration.tap import Tap

from .test_reconciler_support import DEADLINE_S, Cluster, role, until

pytestmark = pytest.mark.integration


async def test_promotion_moves_the_operator_to_the_new_real_env(
    settings: Settings,
    pg_dsn: str,
    make_env: EnvFactory,
    cluster: Cluster,
    kube: Path,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="handlers.operator.kube.runner")
    registry = EnvRegistry(settings, pg_dsn)
    old = await registry.real() or await make_env(mode=EnvMode.REAL)
    standby = await make_env()
    taps = {env: Tap(settings, env) for env in (old.name, standby.name)}
    for tap in taps.values():
        await tap.start()

    # As `dlrover-events operator --follow-real` runs it: through the mode dispatch, with a
    # kubeconfig, started from an env that is not the real one.
    options = {"kubeconfig": str(kube), "namespace": namespace, "follow_real": True}
    conf = kube_settings(options)
    api, ns = await connect(conf)
    assert ns == namespace
    await api.close()
    ctx = ServiceContext(settings, standby.name, pg_dsn)
    operator_task = asyncio.create_task(run_operator(ctx, options))
    try:
        async with asyncio.timeout(DEADLINE_S):
            await ctx.ready.wait()
        name = await cluster.create_job({"worker": role(1)})
        await until(lambda: cluster.workers_running(name, 1), "the job's worker (old real env)")
        meta = await cluster.meta(name)

        async with Producer(settings) as producer:
            await producer.publish(
                cluster.plan(old.name, meta, "old-2", node_group_resources={"worker": _count(2)})
            )
            (result,) = await taps[old.name].until(
                lambda: _results(taps[old.name], "old-2"), "the old env's result"
            )
            assert result.status is ScaleStatus.APPLIED, result.reason
            await until(lambda: cluster.workers_running(name, 2), "2 workers")

            await registry.promote(standby.name, reason="drill: operator follows")
            # The standby learns the cluster's jobs as its own operator lists them.
            await taps[standby.name].until(
                lambda: [e for e in taps[standby.name].events if e.key == meta.uuid],
                "the job announced in the new real env",
            )
            # A plan in the demoted env first, then one in the new real env.
            await producer.publish(
                cluster.plan(
                    old.name, meta, "old-after", node_group_resources={"worker": _count(4)}
                )
            )
            await producer.publish(
                cluster.plan(
                    standby.name, meta, "new-3", node_group_resources={"worker": _count(3)}
                )
            )
            (result,) = await taps[standby.name].until(
                lambda: _results(taps[standby.name], "new-3"), "the new env's result"
            )
            assert result.status is ScaleStatus.APPLIED, result.reason
            await until(lambda: cluster.workers_running(name, 3), "3 workers")

        job = await cluster.job(name)
        assert job is not None
        assert job.roles["worker"].replicas == 3
        assert "old-after" not in job.applied_plans
        assert _results(taps[old.name], "old-after") == []
        said = [r.getMessage() for r in caplog.records]
        assert any(
            f"env {old.name} is no longer the real env" in m and "stops touching the cluster" in m
            for m in said
        ), said
        assert any(f"env {standby.name} is the real env" in m for m in said), said
    finally:
        ctx.stop.set()
        await asyncio.wait_for(operator_task, DEADLINE_S)
        for tap in taps.values():
            await tap.stop()
        await registry.promote(old.name, reason="back")  # the session's real env as found


def _count(n: int) -> NodeGroupResource:
    return NodeGroupResource(count=n)


def _results(tap: Tap, plan_id: str) -> list[ScaleResult]:
    return [r for r in tap.of(ScaleResult) if r.plan_id == plan_id]


async def test_an_operator_of_one_env_stands_still_while_it_is_not_real(
    settings: Settings,
    pg_dsn: str,
    make_env: EnvFactory,
    cluster: Cluster,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without follow_real the operator is its env's: demoted, it leaves the cluster."""
    caplog.set_level(logging.WARNING, logger="handlers.operator.kube.runner")
    registry = EnvRegistry(settings, pg_dsn)
    real = await registry.real() or await make_env(mode=EnvMode.REAL)
    standby = await make_env()
    operator = RealOperator(settings, pg_dsn, KubeCluster(cluster.kube), env=real.name)
    stop = asyncio.Event()
    task = asyncio.create_task(operator.run(stop))
    try:

        async def acting(env: str | None) -> bool:
            cur = operator.current
            return operator.active == env and (
                env is None or (cur is not None and cur.ready.is_set())
            )

        await until(lambda: acting(real.name), f"the operator acting for {real.name}")
        await registry.promote(standby.name, reason="drill: operator stands still")
        await until(lambda: acting(None), "the operator leaving the cluster alone")
        assert operator.current is None
        await registry.promote(real.name, reason="back")
        await until(lambda: acting(real.name), f"the operator acting for {real.name} again")
    finally:
        stop.set()
        await asyncio.wait_for(task, DEADLINE_S)
        if (now := await registry.real()) is not None and now.name != real.name:
            await registry.promote(real.name, reason="back")
    said = [r.getMessage() for r in caplog.records]
    assert any(f"env {real.name} is no longer the real env" in m for m in said), said
