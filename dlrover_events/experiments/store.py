"""The env's experiment tables (migration 0009), read by every door and written by the
experiments recorder alone.

Writes are idempotent: an experiment is kept once by name (its first submission: the
searcher ignores a second one too), a decision once by ``(experiment, seq)``, a report
once by its event id, so a batch written again after a crash before its commit adds
nothing. A batch is one transaction of one statement per table, whatever its size: the
recorder stores thousands of reports a second that way, each queryable once its batch
commits. Reads return plain-JSON rows (`rows`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import asyncpg

from dlrover_events.errors import UserError
from dlrover_events.experiments.rows import (
    ExperimentStatus,
    described,
    experiment_row,
    metric_row,
    searcher_of,
    status_after,
)
from schemas.experiments import (
    DecisionKind,
    ExperimentAction,
    ExperimentSubmitted,
    TrialDecision,
    TrialMetrics,
)

if TYPE_CHECKING:
    #: a connection of the store's pool
    Conn = asyncpg.pool.PoolConnectionProxy[asyncpg.Record]


class ExperimentNotFound(UserError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no experiment named {name!r} (see `dlrover-events experiment list`)")
        self.name = name


@dataclass
class Batch:
    """What a batch of events means to the tables, in the order read."""

    submitted: list[ExperimentSubmitted] = field(default_factory=list)
    decisions: list[TrialDecision] = field(default_factory=list)
    metrics: list[TrialMetrics] = field(default_factory=list)
    #: what may change an experiment's status: actions, and ``done`` decisions
    changes: list[ExperimentAction | TrialDecision] = field(default_factory=list)
    #: events of other types (not the experiments' to record)
    other: int = 0

    def add(self, event: object) -> None:
        match event:
            case TrialMetrics():
                self.metrics.append(event)
            case TrialDecision():
                self.decisions.append(event)
                if event.decision is DecisionKind.DONE:
                    self.changes.append(event)
            case ExperimentSubmitted():
                self.submitted.append(event)
            case ExperimentAction():
                self.changes.append(event)
            case _:
                self.other += 1


@dataclass(frozen=True)
class Recorded:
    """What a batch added (rows new to the tables; a batch read again adds none)."""

    experiments: int = 0
    decisions: int = 0
    metrics: int = 0
    status_changes: int = 0


def _count(status: str) -> int:
    return int(status.rsplit(" ", 1)[1])


class ExperimentStore:
    """The experiment tables of one env, through a pool bound to its schema."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    # -- writes (the recorder) ------------------------------------------------------

    async def record(self, batch: Batch) -> Recorded:
        """Store a batch in one transaction: submissions, decisions, reports, then the
        status each action and ``done`` leads to, in the order they happened."""
        async with self.pool.acquire() as conn, conn.transaction():
            experiments = await self._submissions(conn, batch.submitted)
            decisions = await self._decisions(conn, batch.decisions)
            metrics = await self._metrics(conn, batch.metrics)
            changed = 0
            for event in sorted(batch.changes, key=lambda e: e.occurred_at):
                changed += await self._change(conn, event)
        return Recorded(experiments, decisions, metrics, changed)

    async def _submissions(self, conn: Conn, submitted: Sequence[ExperimentSubmitted]) -> int:
        if not submitted:
            return 0
        # the first submission of a name wins (a row made by a decision read before it
        # has no spec yet: the submission fills it and keeps its status)
        status = await conn.execute(
            "INSERT INTO experiments (name, spec, submitted_at, updated_at)"
            " SELECT n, s, t, t FROM unnest($1::text[], $2::jsonb[], $3::timestamptz[])"
            " AS x(n, s, t)"
            " ON CONFLICT (name) DO UPDATE SET spec = EXCLUDED.spec,"
            " submitted_at = EXCLUDED.submitted_at WHERE experiments.spec IS NULL",
            [e.experiment for e in submitted],
            [e.spec.model_dump(mode="json") for e in submitted],
            [e.occurred_at for e in submitted],
        )
        return _count(status)

    async def _decisions(self, conn: Conn, decisions: Sequence[TrialDecision]) -> int:
        if not decisions:
            return 0
        status = await conn.execute(
            "INSERT INTO trial_decisions (experiment, seq, decision, trial, hparams, budget,"
            " rung, reason, event_id, occurred_at)"
            " SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::int[],"
            " $5::jsonb[], $6::float8[], $7::int[], $8::text[], $9::uuid[],"
            " $10::timestamptz[]) ON CONFLICT DO NOTHING",
            [d.experiment for d in decisions],
            [d.seq for d in decisions],
            [d.decision.value for d in decisions],
            [d.trial for d in decisions],
            [d.hparams for d in decisions],
            [d.budget for d in decisions],
            [d.rung for d in decisions],
            [d.reason for d in decisions],
            [d.event_id for d in decisions],
            [d.occurred_at for d in decisions],
        )
        return _count(status)

    async def _metrics(self, conn: Conn, metrics: Sequence[TrialMetrics]) -> int:
        if not metrics:
            return 0
        status = await conn.execute(
            "INSERT INTO trial_metrics (experiment, trial, step, budget, validation, metrics,"
            " event_id, occurred_at)"
            " SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[], $4::float8[],"
            " $5::bool[], $6::jsonb[], $7::uuid[], $8::timestamptz[])"
            " ON CONFLICT (event_id) DO NOTHING",
            [m.experiment for m in metrics],
            [m.trial for m in metrics],
            [m.step for m in metrics],
            [m.budget for m in metrics],
            [m.validation for m in metrics],
            [m.metrics for m in metrics],
            [m.event_id for m in metrics],
            [m.occurred_at for m in metrics],
        )
        return _count(status)

    async def _change(self, conn: Conn, event: ExperimentAction | TrialDecision) -> int:
        row = await conn.fetchrow(
            "SELECT status FROM experiments WHERE name = $1 FOR UPDATE", event.experiment
        )
        if row is None:
            if isinstance(event, ExperimentAction):
                return 0  # on the submissions' own partition after them: none was submitted
            # a `done` read before its experiment's submission (another topic): kept, so
            # the submission finds the experiment ended
            await conn.execute(
                "INSERT INTO experiments (name) VALUES ($1) ON CONFLICT DO NOTHING",
                event.experiment,
            )
            current = ExperimentStatus.ACTIVE
        else:
            current = ExperimentStatus(row["status"])
        after = status_after(current, event)
        if after is None:
            return 0
        await conn.execute(
            "UPDATE experiments SET status = $2, status_reason = $3, updated_at = $4"
            " WHERE name = $1",
            event.experiment,
            after[0].value,
            after[1],
            event.occurred_at,
        )
        return 1

    # -- reads (every door) ------------------------------------------------------

    async def exists(self, name: str) -> bool:
        return bool(await self.pool.fetchval("SELECT 1 FROM experiments WHERE name = $1", name))

    async def status(self, name: str) -> ExperimentStatus:
        found = await self.pool.fetchval("SELECT status FROM experiments WHERE name = $1", name)
        if found is None:
            raise ExperimentNotFound(name)
        return ExperimentStatus(found)

    async def experiments(self) -> list[dict[str, Any]]:
        """Every experiment, newest first: status, searcher, trials created, the best
        validation value of its metric and the trial that reported it."""
        rows = await self.pool.fetch(
            """
            SELECT e.name, e.spec, e.status, e.status_reason, e.submitted_at, e.updated_at,
                (SELECT count(*) FROM trial_decisions d
                 WHERE d.experiment = e.name AND d.decision = 'create') AS trials,
                b.trial AS best_trial, b.value AS best_value
            FROM experiments e
            LEFT JOIN LATERAL (
                SELECT m.trial, (m.metrics ->> (e.spec #>> '{searcher,metric}'))::float8 AS value
                FROM trial_metrics m
                WHERE m.experiment = e.name AND m.validation
                    AND m.metrics ? (e.spec #>> '{searcher,metric}')
                ORDER BY (m.metrics ->> (e.spec #>> '{searcher,metric}'))::float8
                    * CASE WHEN coalesce((e.spec #>> '{searcher,smaller_is_better}')::bool, true)
                      THEN 1 ELSE -1 END, m.trial
                LIMIT 1) b ON true
            ORDER BY e.submitted_at DESC NULLS LAST, e.name
            """
        )
        return [experiment_row(dict(r)) for r in rows]

    async def describe(self, name: str) -> dict[str, Any]:
        """One experiment: spec, status, every trial (hparams, status, rung, budget
        given, last report, last and best validation value, its decisions), the rungs,
        the best trial."""
        # one snapshot: the trials, their reports and the best trial agree
        async with (
            self.pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            return await self._describe(conn, name)

    async def _describe(self, conn: Conn, name: str) -> dict[str, Any]:
        experiment = await conn.fetchrow(
            "SELECT name, spec, status, status_reason, submitted_at, updated_at"
            " FROM experiments WHERE name = $1",
            name,
        )
        if experiment is None:
            raise ExperimentNotFound(name)
        decisions = await conn.fetch(
            "SELECT seq, decision, trial, hparams, budget, rung, reason, occurred_at"
            " FROM trial_decisions WHERE experiment = $1 ORDER BY seq",
            name,
        )
        # the trials told something, and those that reported (a report may be read before
        # its trial's create): the index walked trial by trial, not every report read
        reported = await conn.fetch(
            "WITH RECURSIVE t(trial) AS ("
            " (SELECT trial FROM trial_metrics WHERE experiment = $1 ORDER BY trial LIMIT 1)"
            " UNION ALL SELECT (SELECT m.trial FROM trial_metrics m WHERE m.experiment = $1"
            " AND m.trial > t.trial ORDER BY m.trial LIMIT 1) FROM t WHERE t.trial IS NOT NULL)"
            " SELECT trial FROM t WHERE trial IS NOT NULL",
            name,
        )
        told = {d["trial"] for d in decisions if d["trial"] is not None}
        trials = sorted(told | {r["trial"] for r in reported})
        progress = await conn.fetch(
            "SELECT t.trial, m.step, m.budget FROM unnest($2::int[]) AS t(trial)"
            " CROSS JOIN LATERAL (SELECT step, budget FROM trial_metrics"
            " WHERE experiment = $1 AND trial = t.trial"
            " ORDER BY step DESC, occurred_at DESC LIMIT 1) m",
            name,
            trials,
        )
        _, metric, smaller = searcher_of(experiment["spec"])
        validation = await conn.fetch(
            "SELECT trial, count(*) AS count,"
            " (array_agg(v ORDER BY step DESC, occurred_at DESC))[1] AS last,"
            " min(v) AS low, max(v) AS high"
            " FROM (SELECT trial, step, occurred_at, (metrics ->> $2)::float8 AS v"
            " FROM trial_metrics WHERE experiment = $1 AND validation AND metrics ? $2) x"
            " GROUP BY trial",
            name,
            metric or "",
        )
        return described(
            dict(experiment),
            [dict(d) for d in decisions],
            {r["trial"]: dict(r) for r in progress},
            {
                r["trial"]: {
                    "last": r["last"],
                    "best": r["low"] if smaller else r["high"],
                    "count": r["count"],
                }
                for r in validation
            },
        )

    async def trial_metrics(
        self, name: str, trial: int, *, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """A trial's reports, training and validation, by step (the first ``limit``)."""
        if not await self.exists(name):
            raise ExperimentNotFound(name)
        rows = await self.pool.fetch(
            "SELECT step, budget, validation, metrics, occurred_at FROM trial_metrics"
            " WHERE experiment = $1 AND trial = $2 ORDER BY step, validation, occurred_at"
            " LIMIT $3",
            name,
            trial,
            limit,
        )
        return [metric_row(dict(r)) for r in rows]

    async def count_metrics(self, name: str) -> int:
        """Reports stored for an experiment (the bench waits on it)."""
        return int(
            await self.pool.fetchval(
                "SELECT count(*) FROM trial_metrics WHERE experiment = $1", name
            )
        )


__all__ = ["Batch", "ExperimentNotFound", "ExperimentStore", "Recorded"]
