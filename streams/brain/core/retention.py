"""Retention of finished jobs, the pure part: which finished jobs a prune cuts to
tombstones and which tombstones it deletes (`streams.brain.runtime.retention` reads the
finished jobs and writes the pruning; the rules are the env's `brain` settings,
`retention_s`, `tombstone_s`, `max_tombstones`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from schemas.env_settings import BrainSettings


@dataclass(frozen=True)
class Finished:
    """A finished job as its `job_states` row says: when it ended, and whether it is a
    tombstone already."""

    job_uuid: str
    finished_at: datetime
    pruned: bool = False


@dataclass(frozen=True)
class Pruning:
    """What one prune does: jobs cut to tombstones, tombstones deleted (both sorted)."""

    tombstone: tuple[str, ...] = ()
    delete: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.tombstone or self.delete)


def select(jobs: Iterable[Finished], now: datetime, rules: BrainSettings) -> Pruning:
    """Which finished jobs become tombstones and which tombstones go, as of `now`, by
    the env's `rules` (none while `retention_s` is unset: finished jobs are kept).

    A job ended `retention_s` ago or more is made a tombstone; one ended `retention_s +
    tombstone_s` ago or more goes (straight away if it never was one). Of the tombstones
    left, only the `max_tombstones` newest (by end, then id) stay."""
    if rules.retention_s is None:
        return Pruning()
    prune_before = now - timedelta(seconds=rules.retention_s)
    forget_before = prune_before - timedelta(seconds=rules.tombstone_s)
    tombstones: list[Finished] = []
    delete: list[str] = []
    for job in jobs:
        if job.finished_at <= forget_before:
            delete.append(job.job_uuid)
        elif job.pruned or job.finished_at <= prune_before:
            tombstones.append(job)
    tombstones.sort(key=lambda j: (j.finished_at, j.job_uuid), reverse=True)
    kept, over = tombstones[: rules.max_tombstones], tombstones[rules.max_tombstones :]
    delete.extend(j.job_uuid for j in over)
    return Pruning(
        tombstone=tuple(sorted(j.job_uuid for j in kept if not j.pruned)),
        delete=tuple(sorted(delete)),
    )


@dataclass(frozen=True)
class Pruned:
    """What a prune did, for logs and metrics."""

    tombstones: int = 0
    deleted: int = 0
