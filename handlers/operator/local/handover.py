"""The local platform across a promotion: this machine's jobs go to the new real env.

Each env's local jobs live under ``<data dir>/local/<env>`` (``runner.platform_root``), and a
node's processes are started with the paths of that folder (its shim writes its pid and its
exit there), so they cannot move. When a standby is promoted, the jobs that run are the
machine's, as a cluster's TrainingJobs are the cluster's: the new real env's operator must
see them, adopt their processes (same pids) and start none twice. So its folder becomes a
link to the folder the jobs are in (the old real env's, followed to the end of its own
link), made once, when the new env's operator first starts; from then on both names are one
folder, and a later promotion (back, or to a third env) links again or finds the folder
its own.

An env whose folder already holds jobs (it ran real before, with jobs of its own) keeps
it: the old real env's jobs are then not adopted, and the operator says so once.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

log = logging.getLogger(__name__)


class Own(StrEnum):
    """What ``local/<env>`` is when the env's operator starts."""

    ABSENT = "absent"
    #: a folder without a job or a pod (made by a `job list` of the env, or an operator
    #: that ran no job): nothing in it to keep running
    EMPTY = "empty"
    #: a link already (a promotion before): the machine's jobs
    LINK = "link"
    #: jobs, none of them with a pod yet (submitted to the env before its operator ran)
    QUEUED = "queued"
    JOBS = "jobs"


class Step(StrEnum):
    KEEP = "keep"
    #: make the env's folder a link to the previous real env's
    LINK = "link"
    #: move the empty folder aside, then link
    REPLACE = "replace"
    #: move its jobs (no pod yet) into the previous env's folder, the rest aside, then link
    MERGE = "merge"
    #: keep the env's own jobs; the previous env's are left unadopted (said once)
    KEEP_OWN = "keep own"


@dataclass(frozen=True)
class Facts:
    own: Own
    #: the env that was real before this one (the registry's last switch to it), if any
    previous: str | None
    #: whether the previous env's folder exists and holds jobs or pods
    previous_has_jobs: bool
    #: whether both names are one folder already
    same_folder: bool


def step(facts: Facts) -> Step:
    """What to do with ``local/<env>`` before its operator starts (pure)."""
    if facts.previous is None or facts.same_folder or not facts.previous_has_jobs:
        return Step.KEEP
    if facts.own == Own.ABSENT:
        return Step.LINK
    if facts.own in (Own.EMPTY, Own.LINK):
        return Step.REPLACE
    if facts.own == Own.QUEUED:
        return Step.MERGE
    return Step.KEEP_OWN


def _any(folder: Path) -> bool:
    return folder.is_dir() and any(folder.iterdir())


def _has_jobs(root: Path) -> bool:
    return _any(root / "jobs") or _any(root / "pods")


def facts_of(base: Path, env: str, previous: str | None) -> Facts:
    own_path = base / env
    if own_path.is_symlink():
        own = Own.LINK
    elif not own_path.exists():
        own = Own.ABSENT
    else:
        own = (
            Own.JOBS
            if _any(own_path / "pods")
            else Own.QUEUED
            if _any(own_path / "jobs")
            else Own.EMPTY
        )
    if previous is None:
        return Facts(own, None, False, False)
    prev_path = base / previous
    prev_has = prev_path.is_dir() and _has_jobs(prev_path)
    same = own_path.exists() and prev_path.exists() and own_path.resolve() == prev_path.resolve()
    return Facts(own, previous, prev_has, same)


def hand_over(base: Path, env: str, previous: str | None) -> Step:
    """Make ``base/env`` the folder of the machine's jobs where it must be (see the
    module's docstring); returns what was done."""
    base.mkdir(parents=True, exist_ok=True)
    facts = facts_of(base, env, previous)
    todo = step(facts)
    own = base / env
    if todo in (Step.LINK, Step.REPLACE, Step.MERGE):
        assert previous is not None
        target = (base / previous).resolve()
        # relative when it is a sibling, so that a data dir moved whole keeps its links
        link_to = target.name if target.parent == base.resolve() else str(target)
        if todo == Step.MERGE:
            _move_jobs(own / "jobs", target / "jobs")
        if todo in (Step.REPLACE, Step.MERGE):
            if own.is_symlink():
                own.unlink()
            else:
                os.rename(own, base / f".{env}.before-{int(time.time())}")
        tmp = base / f".{env}.link-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        os.symlink(link_to, tmp)
        os.replace(tmp, own)
        log.warning(
            "local platform: env %s takes over the jobs of env %s (the real env before it): "
            "%s links to %s; their running processes are adopted, none started again",
            env,
            previous,
            own,
            target,
        )
    elif todo == Step.KEEP_OWN:
        assert previous is not None
        log.warning(
            "local platform: env %s has jobs of its own under %s; the jobs of env %s (the "
            "real env before it) under %s are not adopted: their processes run on unmanaged",
            env,
            own,
            previous,
            base / previous,
        )
    return todo


def _move_jobs(src: Path, dst: Path) -> None:
    """Jobs with no pod yet, into the machine's folder: a job of the same name there stays,
    and the one moved aside with the rest is said."""
    dst.mkdir(parents=True, exist_ok=True)
    for record in sorted(src.iterdir()):
        if (dst / record.name).exists():
            log.warning(
                "local platform: job %s is in both folders; the one under %s is kept aside",
                record.stem,
                src,
            )
            continue
        os.rename(record, dst / record.name)


__all__ = ["Facts", "Own", "Step", "facts_of", "hand_over", "step"]
