"""Which ScalePlans an env's operator has applied: the env's ``scale_plans`` table.

The simulated cluster lives in memory and a consumer re-reads what it had not committed,
so "each plan_id at most once" has to hold in Postgres, across restarts: a row whose
``applied_at`` is set is final, and no write below ever changes it.
"""

from __future__ import annotations

import asyncpg

from schemas.plans import ScalePlan, ScaleStatus


class PlanLedger:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def applied(self, plan_id: str) -> bool:
        found = await self._pool.fetchval(
            "SELECT applied_at IS NOT NULL FROM scale_plans WHERE plan_id = $1", plan_id
        )
        return bool(found)

    async def record(self, plan: ScalePlan, status: ScaleStatus, reason: str) -> bool:
        """Record what became of a plan; False when it was already applied (left as is).

        The brain may have stored the plan as pending first; a rejected plan may be tried
        again (the job may have been submitted meanwhile); an applied one never changes.
        """
        row = await self._pool.fetchval(
            """
            INSERT INTO scale_plans (plan_id, job_uuid, source_plan, body, status, reason,
                                     applied_at)
            VALUES ($1, $2, $3, $4, $5, $6, CASE WHEN $5 = 'applied' THEN now() END)
            ON CONFLICT (plan_id) DO UPDATE
                SET status = EXCLUDED.status,
                    reason = EXCLUDED.reason,
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
        )
        return row is not None
