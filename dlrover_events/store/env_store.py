"""One env's tables, through a pool bound to its schema.

Writes are idempotent by construction (event ids, plan ids as keys), which is what lets
consumers commit after the effect and re-process safely after a crash.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import asyncpg

from dlrover_events.store.database import create_pool, env_schema
from schemas.evaluation import EvaluationReport
from schemas.plans import OptimizePlan, ScalePlan

if TYPE_CHECKING:
    from dlrover_events.bus.consumer import Received


class EnvStore:
    def __init__(self, pool: asyncpg.Pool, env: str) -> None:
        self.pool = pool
        self.env = env
        self.schema = env_schema(env)

    @classmethod
    async def open(cls, dsn: str, env: str, *, max_size: int = 10) -> EnvStore:
        pool = await create_pool(dsn, env_schema(env), max_size=max_size)
        return cls(pool, env)

    async def close(self) -> None:
        await self.pool.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def tables(self) -> list[str]:
        rows = await self.pool.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = $1"
            " ORDER BY table_name",
            self.schema,
        )
        return [r["table_name"] for r in rows]

    async def archive(self, items: Sequence[Received]) -> int:
        """Store events once per event_id; returns how many were new."""
        if not items:
            return 0
        rows = [
            (
                r.event.event_id,
                r.event.type,
                r.topic,
                r.partition,
                r.offset,
                r.event.key,
                r.event.occurred_at,
                r.event.model_dump(mode="json", by_alias=True),
            )
            for r in items
        ]
        async with self.pool.acquire() as conn:
            result = await conn.fetchval(
                """
                WITH ins AS (
                    INSERT INTO events_archive
                        (event_id, type, topic, partition, "offset", key, occurred_at, body)
                    SELECT * FROM unnest(
                        $1::uuid[], $2::text[], $3::text[], $4::int[], $5::bigint[],
                        $6::text[], $7::timestamptz[], $8::jsonb[])
                    ON CONFLICT (event_id) DO NOTHING
                    RETURNING 1)
                SELECT count(*) FROM ins
                """,
                *map(list, zip(*rows, strict=True)),
            )
        return int(result)

    async def save_plan(self, plan: OptimizePlan) -> bool:
        """Record an OptimizePlan; False when that plan_id was already recorded."""
        return await self.save_plans([plan]) == 1

    async def save_plans(self, plans: Sequence[OptimizePlan]) -> int:
        """Record OptimizePlans in one statement, each once; how many were new. One
        statement, not one per plan: a brain checkpoints hundreds at a time, and a round
        trip each cost it more than deciding them."""
        if not plans:
            return 0
        status = await self.pool.execute(
            "INSERT INTO plans (plan_id, job_uuid, optimizer, stage, reason, resource, caused_by)"
            " SELECT p, j, o, s, r, res::jsonb, c FROM unnest("
            "$1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[]"
            ") AS t(p, j, o, s, r, res, c) ON CONFLICT (plan_id) DO NOTHING",
            [plan.plan_id for plan in plans],
            [plan.job.uuid for plan in plans],
            [plan.optimizer for plan in plans],
            [plan.stage for plan in plans],
            [plan.reason for plan in plans],
            [plan.resource.model_dump_json() for plan in plans],
            [plan.caused_by for plan in plans],
        )
        return _inserted(status)

    async def save_scale_plan(self, plan: ScalePlan) -> bool:
        """Record a ScalePlan once; False when that plan_id was already recorded."""
        return await self.save_scale_plans([plan]) == 1

    async def save_scale_plans(self, plans: Sequence[ScalePlan]) -> int:
        """Record ScalePlans in one statement, each once; how many were new.

        Rows are written in plan id order, as the virtual operator writes its answers to
        them: two transactions writing the same rows in different orders deadlock."""
        if not plans:
            return 0
        plans = sorted(plans, key=lambda plan: plan.plan_id)
        status = await self.pool.execute(
            "INSERT INTO scale_plans (plan_id, job_uuid, source_plan, body)"
            " SELECT p, j, s, b::jsonb FROM unnest($1::text[], $2::text[], $3::text[], $4::text[])"
            " AS t(p, j, s, b) ORDER BY p ON CONFLICT (plan_id) DO NOTHING",
            [plan.plan_id for plan in plans],
            [plan.job.uuid for plan in plans],
            [plan.source_plan for plan in plans],
            [plan.model_dump_json() for plan in plans],
        )
        return _inserted(status)

    async def save_evaluation(self, report: EvaluationReport) -> bool:
        """Record an evaluation report once per event_id."""
        status = await self.pool.execute(
            "INSERT INTO evaluation_results"
            " (event_id, evaluator, window_start, window_end, jobs, metrics)"
            " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (event_id) DO NOTHING",
            report.event_id,
            report.evaluator,
            report.window_start,
            report.window_end,
            report.jobs,
            report.metrics,
        )
        return bool(status.endswith(" 1"))

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        rows: list[asyncpg.Record] = await self.pool.fetch(query, *args)
        return rows


def _inserted(status: str) -> int:
    """The rows an `INSERT 0 n` status says were inserted."""
    return int(status.rsplit(" ", 1)[1])
