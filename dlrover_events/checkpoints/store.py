"""The env's checkpoint catalog and model registry (migration 0011), read by every door and
written by the checkpoints service (the catalog, retention) and by `model register` (the
registry).

Recording is idempotent: a checkpoint is kept once by its id, a deletion sets its row's
state once, so a batch read again after a crash adds nothing. Retention and registration
meet here, in the database, so that a checkpoint a model version references is never
deleted: retention locks the rows it decides on, reads the references after it holds
them, and marks its choice ``deleting`` in the same transaction; registration locks the
checkpoint's row and refuses one that is not ``kept`` any more. Whichever commits first,
the other sees it. Files are removed afterwards, outside any transaction (the service's
deleter), and a row stays ``deleting`` until they are gone, so a restart finishes it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import asyncpg

from dlrover_events.checkpoints.retention import (
    Candidate,
    Decision,
    Goal,
    RetentionPolicy,
    decide,
)
from dlrover_events.errors import UserError
from schemas.checkpoints import CheckpointCommitted, CheckpointDeleted

if TYPE_CHECKING:
    Conn = asyncpg.pool.PoolConnectionProxy[asyncpg.Record]

#: A model's name: what a URL path, a shell and a file name all take unquoted.
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MAX_NOTES = 4096
MAX_LABELS = 64
MAX_LABEL = 256
#: A job's plans listed in a version's lineage (the newest).
MAX_LINEAGE_PLANS = 50


class CheckpointNotFound(UserError):
    def __init__(self, checkpoint_id: str) -> None:
        super().__init__(
            f"no checkpoint {checkpoint_id!r} in this env (see `dlrover-events checkpoint list`)"
        )
        self.checkpoint_id = checkpoint_id


class ModelNotFound(UserError):
    def __init__(self, name: str, version: int | None = None) -> None:
        what = f"model {name!r}" if version is None else f"version {version} of model {name!r}"
        super().__init__(f"no {what} (see `dlrover-events model list`)")
        self.name = name


class RegistrationRefused(UserError):
    """A registration that cannot be: the checkpoint is gone, a name or a label is bad."""


class CheckpointGone(RegistrationRefused):
    """The checkpoint is deleted, or retention has chosen it: its files are gone."""


def check_model_name(name: str) -> str:
    if not MODEL_NAME.fullmatch(name):
        raise RegistrationRefused(
            f"model name {name!r}: a letter or digit, then up to 127 letters, digits, '.', '_'"
            " or '-'"
        )
    return name


def check_registration(notes: str, labels: Sequence[str]) -> list[str]:
    """Notes and labels within their bounds; the labels, each once, in the order given."""
    if len(notes) > MAX_NOTES or "\x00" in notes:
        raise RegistrationRefused(f"notes: at most {MAX_NOTES} characters, no NUL")
    seen: list[str] = []
    for label in labels:
        if not label or len(label) > MAX_LABEL or "\x00" in label:
            raise RegistrationRefused(f"label {label!r}: 1 to {MAX_LABEL} characters, no NUL")
        if label not in seen:
            seen.append(label)
    if len(seen) > MAX_LABELS:
        raise RegistrationRefused(f"at most {MAX_LABELS} labels")
    return seen


@dataclass
class Batch:
    """What a batch of events means to the catalog."""

    committed: list[CheckpointCommitted] = field(default_factory=list)
    deleted: list[CheckpointDeleted] = field(default_factory=list)
    other: int = 0

    def add(self, event: object) -> None:
        match event:
            case CheckpointCommitted():
                self.committed.append(event)
            case CheckpointDeleted():
                self.deleted.append(event)
            case _:
                self.other += 1


@dataclass(frozen=True)
class Recorded:
    """What a batch changed: checkpoints new to the catalog, rows set deleted, and the
    jobs and experiments whose retention may have changed."""

    committed: int = 0
    deleted: int = 0
    jobs: frozenset[str] = frozenset()
    experiments: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Pending:
    """A checkpoint retention chose, whose files are still to remove."""

    checkpoint_id: str
    url: str
    job_uuid: str
    job_name: str
    experiment: str | None
    trial: int | None
    step: int
    reason: str
    detail: str


def _count(status: str) -> int:
    return int(status.rsplit(" ", 1)[1])


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def checkpoint_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint as `checkpoint list` and ``GET /v1/checkpoints`` show it."""
    return {k: _plain(v) for k, v in row.items() if k != "event_id"}


_CHECKPOINT_COLUMNS = (
    "checkpoint_id, job_uuid, job_name, experiment, trial, step, world_size, plan_id, metrics,"
    " size_bytes, url, blocking_s, persist_s, format, format_version, reason, committed_at,"
    " state, delete_reason, delete_detail, deleted_at"
)


class CheckpointStore:
    """The checkpoint and model tables of one env, through a pool bound to its schema."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    # -- the catalog (the checkpoints service) -----------------------------------------

    async def record(self, batch: Batch) -> Recorded:
        """Store a batch in one transaction: new checkpoints, then deletions told."""
        async with self.pool.acquire() as conn, conn.transaction():
            committed = await self._committed(conn, batch.committed)
            deleted = await self._deleted(conn, batch.deleted)
        return Recorded(
            committed,
            deleted,
            frozenset(e.job.uuid for e in batch.committed),
            frozenset(e.experiment for e in batch.committed if e.experiment is not None),
        )

    async def _committed(self, conn: Conn, events: Sequence[CheckpointCommitted]) -> int:
        if not events:
            return 0
        status = await conn.execute(
            "INSERT INTO checkpoints (checkpoint_id, job_uuid, job_name, experiment, trial, step,"
            " world_size, plan_id, metrics, size_bytes, url, blocking_s, persist_s, format,"
            " format_version, reason, event_id, committed_at)"
            " SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int[],"
            " $6::bigint[], $7::int[], $8::text[], $9::jsonb[], $10::bigint[], $11::text[],"
            " $12::float8[], $13::float8[], $14::text[], $15::int[], $16::text[], $17::uuid[],"
            " $18::timestamptz[]) ON CONFLICT DO NOTHING",
            [e.checkpoint_id for e in events],
            [e.job.uuid for e in events],
            [e.job.name for e in events],
            [e.experiment for e in events],
            [e.trial for e in events],
            [e.step for e in events],
            [e.world_size for e in events],
            [e.plan_id for e in events],
            [e.metrics for e in events],
            [e.size_bytes for e in events],
            [e.url for e in events],
            [e.blocking_s for e in events],
            [e.persist_s for e in events],
            [e.format for e in events],
            [e.format_version for e in events],
            [e.reason.value for e in events],
            [e.event_id for e in events],
            [e.occurred_at for e in events],
        )
        return _count(status)

    async def _deleted(self, conn: Conn, events: Sequence[CheckpointDeleted]) -> int:
        if not events:
            return 0
        status = await conn.execute(
            "UPDATE checkpoints c SET state = 'deleted', delete_reason = x.r,"
            " delete_detail = x.d, deleted_at = x.t"
            " FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[]) AS x(i, r, d, t)"
            " WHERE c.checkpoint_id = x.i AND c.state <> 'deleted'",
            [e.checkpoint_id for e in events],
            [e.reason.value for e in events],
            [e.detail for e in events],
            [e.occurred_at for e in events],
        )
        return _count(status)

    async def goals(self, experiments: Iterable[str]) -> dict[str, Goal]:
        """Each recorded experiment's metric and direction (its searcher's)."""
        rows = await self.pool.fetch(
            "SELECT name, spec #>> '{searcher,metric}' AS metric,"
            " coalesce((spec #>> '{searcher,smaller_is_better}')::bool, true) AS smaller"
            " FROM experiments WHERE name = ANY($1::text[]) AND spec IS NOT NULL",
            list(experiments),
        )
        return {
            r["name"]: Goal(metric=r["metric"], smaller_is_better=r["smaller"])
            for r in rows
            if r["metric"]
        }

    async def apply_retention(
        self, policy: RetentionPolicy, jobs: Iterable[str], experiments: Iterable[str]
    ) -> Decision:
        """Decide retention for the checkpoints of ``jobs`` and of every job of
        ``experiments``, and mark what it deletes ``deleting``, in one transaction that
        holds their rows: a registration waits for it, or it for the registration."""
        jobs, experiments = sorted(set(jobs)), sorted(set(experiments))
        async with self.pool.acquire() as conn, conn.transaction():
            # every experiment of the jobs named: its best is over all of its jobs
            found = await conn.fetch(
                "SELECT DISTINCT experiment FROM checkpoints"
                " WHERE job_uuid = ANY($1::text[]) AND experiment IS NOT NULL",
                jobs,
            )
            experiments = sorted({*experiments, *(r["experiment"] for r in found)})
            rows = await conn.fetch(
                "SELECT checkpoint_id, job_uuid, experiment, step, committed_at, metrics"
                " FROM checkpoints WHERE state = 'kept'"
                " AND (job_uuid = ANY($1::text[]) OR experiment = ANY($2::text[]))"
                " ORDER BY checkpoint_id FOR UPDATE",
                jobs,
                experiments,
            )
            if not rows:
                return Decision(keep={}, delete={})
            ids = [r["checkpoint_id"] for r in rows]
            # read after the rows are held: a registration committed meanwhile is seen
            referenced = {
                r["checkpoint_id"]
                for r in await conn.fetch(
                    "SELECT DISTINCT checkpoint_id FROM model_versions"
                    " WHERE checkpoint_id = ANY($1::text[])",
                    ids,
                )
            }
            goals = await self.goals(experiments) if experiments else {}
            decision = decide(
                [
                    Candidate(
                        checkpoint_id=r["checkpoint_id"],
                        job=r["job_uuid"],
                        experiment=r["experiment"],
                        step=r["step"],
                        committed_at=r["committed_at"],
                        metrics={
                            k: float(v)
                            for k, v in r["metrics"].items()
                            if isinstance(v, int | float)
                        },
                        referenced=r["checkpoint_id"] in referenced,
                    )
                    for r in rows
                ],
                policy,
                goals,
            )
            if decision.delete:
                await conn.execute(
                    "UPDATE checkpoints c SET state = 'deleting', delete_reason = 'retention',"
                    " delete_detail = x.d FROM unnest($1::text[], $2::text[]) AS x(i, d)"
                    " WHERE c.checkpoint_id = x.i AND c.state = 'kept'",
                    list(decision.delete),
                    list(decision.delete.values()),
                )
        return decision

    async def pending(self, limit: int = 100) -> list[Pending]:
        """Checkpoints whose files are still to remove, oldest first."""
        rows = await self.pool.fetch(
            "SELECT checkpoint_id, url, job_uuid, job_name, experiment, trial, step,"
            " coalesce(delete_reason, 'retention') AS reason, delete_detail"
            " FROM checkpoints WHERE state = 'deleting' ORDER BY committed_at LIMIT $1",
            limit,
        )
        return [
            Pending(
                r["checkpoint_id"],
                r["url"],
                r["job_uuid"],
                r["job_name"],
                r["experiment"],
                r["trial"],
                r["step"],
                r["reason"],
                r["delete_detail"],
            )
            for r in rows
        ]

    async def mark_deleted(self, checkpoint_id: str, at: datetime) -> None:
        await self.pool.execute(
            "UPDATE checkpoints SET state = 'deleted', deleted_at = $2"
            " WHERE checkpoint_id = $1 AND state = 'deleting'",
            checkpoint_id,
            at,
        )

    # -- reads (every door) ------------------------------------------------------------

    async def checkpoints(
        self,
        *,
        job: str | None = None,
        experiment: str | None = None,
        include_deleted: bool = False,
        limit: int = 1000,
    ) -> list[dict[str, Any]]:
        """A job's checkpoints (by name or uuid) or an experiment's, newest first."""
        rows = await self.pool.fetch(
            f"SELECT {_CHECKPOINT_COLUMNS} FROM checkpoints"
            " WHERE ($1::text IS NULL OR job_name = $1 OR job_uuid = $1)"
            " AND ($2::text IS NULL OR experiment = $2)"
            " AND ($3 OR state <> 'deleted')"
            " ORDER BY step DESC, committed_at DESC, checkpoint_id LIMIT $4",
            job,
            experiment,
            include_deleted,
            limit,
        )
        return [checkpoint_row(dict(r)) for r in rows]

    async def checkpoint(self, checkpoint_id: str) -> dict[str, Any]:
        row = await self.pool.fetchrow(
            f"SELECT {_CHECKPOINT_COLUMNS} FROM checkpoints WHERE checkpoint_id = $1",
            checkpoint_id,
        )
        if row is None:
            raise CheckpointNotFound(checkpoint_id)
        return checkpoint_row(dict(row))

    async def best_of(self, experiment: str) -> str:
        """The kept checkpoint of ``experiment`` with the best value of its metric (a
        later step first among equals)."""
        goal = (await self.goals([experiment])).get(experiment)
        if goal is None:
            if not await self.pool.fetchval(
                "SELECT 1 FROM experiments WHERE name = $1", experiment
            ):
                raise RegistrationRefused(
                    f"no experiment named {experiment!r} (see `dlrover-events experiment list`)"
                )
            raise RegistrationRefused(f"experiment {experiment!r} has no metric recorded yet")
        order = "ASC" if goal.smaller_is_better else "DESC"
        found = await self.pool.fetchval(
            "SELECT checkpoint_id FROM checkpoints"
            " WHERE experiment = $1 AND state = 'kept' AND metrics ? $2"
            f" ORDER BY (metrics ->> $2)::float8 {order}, step DESC, checkpoint_id LIMIT 1",
            experiment,
            goal.metric,
        )
        if found is None:
            raise RegistrationRefused(
                f"experiment {experiment!r} has no kept checkpoint with a value of"
                f" {goal.metric} (see `dlrover-events checkpoint list --experiment {experiment}`)"
            )
        return str(found)

    # -- the registry --------------------------------------------------------------------

    async def register(
        self,
        name: str,
        checkpoint_id: str,
        *,
        notes: str = "",
        labels: Sequence[str] = (),
        description: str | None = None,
        registered_by: str = "",
    ) -> dict[str, Any]:
        """A new version of model ``name`` (made if new) for a kept checkpoint, with its
        lineage as it is now; refused for a checkpoint retention has chosen."""
        check_model_name(name)
        labels = check_registration(notes, labels)
        if description is not None:
            check_registration(description, ())
        async with self.pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                f"SELECT {_CHECKPOINT_COLUMNS} FROM checkpoints WHERE checkpoint_id = $1"
                " FOR UPDATE",
                checkpoint_id,
            )
            if row is None:
                raise CheckpointNotFound(checkpoint_id)
            if row["state"] != "kept":
                why = f" ({row['delete_detail']})" if row["delete_detail"] else ""
                raise CheckpointGone(
                    f"checkpoint {checkpoint_id} is {row['state']} by"
                    f" {row['delete_reason'] or 'a user'}{why}: its files are gone"
                )
            await conn.execute(
                "INSERT INTO models (name, description) VALUES ($1, coalesce($2::text, ''))"
                " ON CONFLICT (name) DO UPDATE SET updated_at = now(),"
                " description = coalesce($2::text, models.description)",
                name,
                description,
            )
            # the model's row is held by the upsert: versions are numbered one at a time
            version = await conn.fetchval(
                "SELECT coalesce(max(version), 0) + 1 FROM model_versions WHERE model = $1", name
            )
            lineage = await self._lineage(conn, dict(row))
            await conn.execute(
                "INSERT INTO model_versions (model, version, checkpoint_id, notes, labels,"
                " lineage, registered_by) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                name,
                version,
                checkpoint_id,
                notes,
                labels,
                lineage,
                registered_by,
            )
        return await self.describe(name, version)

    async def _lineage(self, conn: Conn, row: Mapping[str, Any]) -> dict[str, Any]:
        """Where a checkpoint comes from: its job, trial and experiment, the trial's
        hyperparameters and the experiment's searcher, and the plans the job trained
        under up to it (as its checkpoints recorded them, with what the archive knows of
        each)."""
        lineage: dict[str, Any] = {
            "job": {"uuid": row["job_uuid"], "name": row["job_name"]},
            "experiment": row["experiment"],
            "trial": row["trial"],
            "step": row["step"],
            "world_size": row["world_size"],
            "metrics": row["metrics"],
            "plan_in_force": row["plan_id"],
            "hyperparameters": {},
            "searcher": None,
        }
        if row["experiment"] is not None:
            spec = await conn.fetchval(
                "SELECT spec FROM experiments WHERE name = $1", row["experiment"]
            )
            searcher = (spec or {}).get("searcher") or {}
            if searcher:
                lineage["searcher"] = {
                    "name": searcher.get("name"),
                    "metric": searcher.get("metric"),
                    "smaller_is_better": searcher.get("smaller_is_better", True),
                }
            hparams = await conn.fetchval(
                "SELECT hparams FROM trial_decisions WHERE experiment = $1 AND trial = $2"
                " AND decision = 'create' ORDER BY seq LIMIT 1",
                row["experiment"],
                row["trial"],
            )
            lineage["hyperparameters"] = hparams or {}
        in_force = await conn.fetch(
            "SELECT plan_id, min(step) AS first_step, max(step) AS last_step,"
            " array_agg(DISTINCT world_size) AS world_sizes FROM checkpoints"
            " WHERE job_uuid = $1 AND step <= $2 AND plan_id IS NOT NULL"
            " GROUP BY plan_id ORDER BY min(step) DESC LIMIT $3",
            row["job_uuid"],
            row["step"],
            MAX_LINEAGE_PLANS,
        )
        archived = {
            r["plan_id"]: r
            for r in await conn.fetch(
                "SELECT s.plan_id, s.status, s.created_at, p.reason, p.optimizer"
                " FROM scale_plans s LEFT JOIN plans p ON p.plan_id = s.source_plan"
                " WHERE s.plan_id = ANY($1::text[])",
                [r["plan_id"] for r in in_force],
            )
        }
        plans = []
        for r in reversed(in_force):
            known = archived.get(r["plan_id"])
            plans.append(
                {
                    "plan_id": r["plan_id"],
                    "first_step": r["first_step"],
                    "last_step": r["last_step"],
                    "world_sizes": sorted(r["world_sizes"]),
                    "status": known["status"] if known else None,
                    "optimizer": known["optimizer"] if known else None,
                    "reason": known["reason"] if known else None,
                    "created_at": _plain(known["created_at"]) if known else None,
                }
            )
        lineage["plans"] = plans
        return lineage

    async def models(self) -> list[dict[str, Any]]:
        """Every model, the latest updated first, with its versions' count and latest."""
        rows = await self.pool.fetch(
            "SELECT m.name, m.description, m.created_at, m.updated_at,"
            " count(v.version) AS versions, max(v.version) AS latest"
            " FROM models m LEFT JOIN model_versions v ON v.model = m.name"
            " GROUP BY m.name ORDER BY m.updated_at DESC, m.name"
        )
        return [{k: _plain(v) for k, v in r.items()} for r in rows]

    async def versions(self, name: str) -> list[dict[str, Any]]:
        """A model's versions, newest first, each with its checkpoint's state."""
        if not await self.pool.fetchval("SELECT 1 FROM models WHERE name = $1", name):
            raise ModelNotFound(name)
        rows = await self.pool.fetch(
            "SELECT v.version, v.checkpoint_id, v.notes, v.labels, v.registered_by,"
            " v.created_at, c.url, c.step, c.state, c.job_name, c.experiment, c.trial,"
            " c.metrics FROM model_versions v JOIN checkpoints c USING (checkpoint_id)"
            " WHERE v.model = $1 ORDER BY v.version DESC",
            name,
        )
        return [{k: _plain(v) for k, v in r.items()} for r in rows]

    async def describe(self, name: str, version: int | None = None) -> dict[str, Any]:
        """A model and one version (the latest unless named): notes, labels, the
        checkpoint as the catalog has it now, and its lineage."""
        model = await self.pool.fetchrow(
            "SELECT name, description, created_at, updated_at FROM models WHERE name = $1", name
        )
        if model is None:
            raise ModelNotFound(name)
        row = await self.pool.fetchrow(
            "SELECT version, checkpoint_id, notes, labels, lineage, registered_by, created_at"
            " FROM model_versions WHERE model = $1 AND ($2::int IS NULL OR version = $2)"
            " ORDER BY version DESC LIMIT 1",
            name,
            version,
        )
        if row is None:
            raise ModelNotFound(name, version)
        versions = await self.pool.fetchval(
            "SELECT count(*) FROM model_versions WHERE model = $1", name
        )
        described = {k: _plain(v) for k, v in model.items()}
        described["versions"] = versions
        described["version"] = {
            **{k: _plain(v) for k, v in row.items()},
            "checkpoint": await self.checkpoint(row["checkpoint_id"]),
        }
        return described


__all__ = [
    "Batch",
    "CheckpointGone",
    "CheckpointNotFound",
    "CheckpointStore",
    "ModelNotFound",
    "Pending",
    "Recorded",
    "RegistrationRefused",
    "check_model_name",
    "check_registration",
    "checkpoint_row",
]
