"""Which ScalePlans an env's operator has applied: the env's ``scale_plans`` table; and
the virtual operator's checkpoint of its simulated cluster (``virtual_cluster``).

A consumer re-reads what it had not committed, so "each plan_id at most once" has to hold
in Postgres, across restarts: a row whose ``applied_at`` is set is final, and no write
below ever changes it. A partial result applied the plan too (some parts of it): it is as
final as an applied one. The virtual operator writes a plan's row in the same transaction
as the checkpoint of the cluster the plan changed, so neither is durable without the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg
from asyncpg.pool import PoolConnectionProxy
from pydantic import TypeAdapter

from schemas.plans import NotApplied, ScalePlan, ScaleStatus

#: Where the rows are: a pool, or one connection held for a process's life (the virtual
#: operator's: a pool's reset on every release costs a round trip per write).
Database = asyncpg.Pool | asyncpg.Connection | PoolConnectionProxy

#: The reason of an answer to a plan delivered again after it applied (then the first
#: answer's reason).
ALREADY_APPLIED = "already applied"

#: The answers that applied a plan (all of it or some): never changed afterwards.
APPLIED_ONCE = frozenset({ScaleStatus.APPLIED, ScaleStatus.PARTIAL})

_PARTS: TypeAdapter[list[NotApplied]] = TypeAdapter(list[NotApplied])


@dataclass(frozen=True)
class Answer:
    """What became of a plan, as its first result said it."""

    status: ScaleStatus
    reason: str
    not_applied: tuple[NotApplied, ...] = ()

    def repeated(self) -> Answer:
        """The answer to the plan delivered again: the same status and parts (a partial
        plan is no more applied the second time), the reason saying it is a repeat."""
        reason = f"{ALREADY_APPLIED}: {self.reason}" if self.reason else ALREADY_APPLIED
        return Answer(self.status, reason, self.not_applied)


class PlanLedger:
    def __init__(self, pool: Database) -> None:
        self._pool = pool

    async def applied(self, plan_id: str) -> bool:
        found = await self._pool.fetchval(
            "SELECT applied_at IS NOT NULL FROM scale_plans WHERE plan_id = $1", plan_id
        )
        return bool(found)

    async def answer(self, plan_id: str) -> Answer | None:
        """The answer the plan got when it applied (applied or partial); None while it has
        not applied."""
        row = await self._pool.fetchrow(
            "SELECT status, reason, not_applied FROM scale_plans"
            " WHERE plan_id = $1 AND applied_at IS NOT NULL",
            plan_id,
        )
        if row is None:
            return None
        return Answer(
            ScaleStatus(row["status"]),
            row["reason"],
            tuple(_PARTS.validate_python(row["not_applied"] or [])),
        )

    async def record(
        self,
        plan: ScalePlan,
        status: ScaleStatus,
        reason: str,
        not_applied: Sequence[NotApplied] = (),
        *,
        conn: asyncpg.Connection | None = None,
    ) -> bool:
        """Record what became of a plan; False when it was already applied (left as is).

        The brain may have stored the plan as pending first; a rejected plan may be tried
        again (the job may have been submitted meanwhile); an applied one never changes.
        ``conn``: write within that connection's transaction.
        """
        db: Database = self._pool if conn is None else conn
        row = await db.fetchval(
            """
            INSERT INTO scale_plans (plan_id, job_uuid, source_plan, body, status, reason,
                                     not_applied, applied_at)
            VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb,
                    CASE WHEN $5 = ANY($8::text[]) THEN now() END)
            ON CONFLICT (plan_id) DO UPDATE
                SET status = EXCLUDED.status,
                    reason = EXCLUDED.reason,
                    not_applied = EXCLUDED.not_applied,
                    applied_at = EXCLUDED.applied_at
                WHERE scale_plans.applied_at IS NULL
            RETURNING plan_id
            """,
            plan.plan_id,
            plan.job.uuid,
            plan.source_plan,
            plan.model_dump(mode="json"),
            status.value,
            reason,
            [p.model_dump(mode="json") for p in not_applied],
            sorted(s.value for s in APPLIED_ONCE),
        )
        return row is not None


class ClusterCheckpoints:
    """The one checkpoint of a virtual env's simulated cluster (handlers.simulator.checkpoint
    makes and reads the bytes), with whether the events it carried were published."""

    def __init__(self, pool: Database) -> None:
        self._pool = pool

    async def load(self) -> tuple[bytes, bool] | None:
        """(the checkpoint, whether its outbox is published); None before the first."""
        row = await self._pool.fetchrow("SELECT state, published FROM virtual_cluster")
        return None if row is None else (bytes(row["state"]), bool(row["published"]))

    async def save(self, conn: asyncpg.Connection, state: bytes, *, published: bool) -> None:
        await conn.execute(
            """
            INSERT INTO virtual_cluster (id, state, published, saved_at)
            VALUES (1, $1, $2, now())
            ON CONFLICT (id) DO UPDATE
                SET state = EXCLUDED.state, published = EXCLUDED.published, saved_at = now()
            """,
            state,
            published,
        )

    async def mark_published(self) -> None:
        """The outbox of the saved checkpoint is on the bus: a restart publishes it no more."""
        await self._pool.execute("UPDATE virtual_cluster SET published = true")


__all__ = ["ALREADY_APPLIED", "APPLIED_ONCE", "Answer", "ClusterCheckpoints", "PlanLedger"]
