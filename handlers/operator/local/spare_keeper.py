"""The warm spares of one env's local platform, kept by its node agent: on disk and as
processes, beside the pods (the decisions are ``spares.py``'s).

A spare is a directory under ``spares/`` (a sibling of ``pods/``), its shim's spec, what
it was started for (``spare.json``) and its shim's pid; a pod admits one by a rename onto
its own directory, then an admission file (under ``admissions/``, outside the directory
that moves) tells the waiting worker what only a pod knows. The keeper is the cluster's
collaborator for this role alone: it starts a spare's shim with the cluster's starter, so
a spare's processes are started, adopted and followed as a pod's are.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from dlrover_events.pods import shim
from handlers.operator.local import spares
from handlers.operator.local.store import read_json, write_json
from handlers.operator.platform.api import JobEntry
from handlers.operator.platform.bodies import JobView, PodView

log = logging.getLogger(__name__)

#: Seconds before a role's spare is started again after one ended on its own (a spare
#: that cannot start must not be started in a loop).
SPARE_BACKOFF_S = 10.0


class SpareKeeper:
    """The spares under ``root`` (the platform's directory, whose ``pods/`` is
    ``pods_dir``); ``start`` starts a shim in a directory under a name, as the cluster
    starts a pod's."""

    def __init__(self, root: Path, pods_dir: Path, start: Callable[[str, Path], None]) -> None:
        self.dir = root / spares.SPARES
        self._admissions = root / spares.ADMISSIONS
        self._pods_dir = pods_dir
        self._start = start
        #: spares asked to end, and when a role's spare last ended on its own
        self._ending: set[str] = set()
        self._failed: dict[tuple[str, str], float] = {}

    def admission_file(self, spare: str) -> Path:
        return self._admissions / f"{spare}.json"

    def forget_admission(self, node_dir: Path) -> None:
        """The admission file of the spare that ``node_dir`` (a pod's or a spare's
        directory) was, if it was one: it goes with the node."""
        record = read_json(node_dir / spares.SPARE)
        if record is not None:
            with contextlib.suppress(OSError):
                self.admission_file(str(record["name"])).unlink()

    def every(self) -> dict[str, tuple[spares.SpareKey, bool]]:
        """Every spare: what it was started for, and whether it still runs."""
        out: dict[str, tuple[spares.SpareKey, bool]] = {}
        if not self.dir.is_dir():
            return out
        for spare_dir in sorted(self.dir.iterdir()):
            record, pid = read_json(spare_dir / spares.SPARE), read_json(spare_dir / shim.PID)
            if record is None:
                continue
            running = pid is not None and shim.alive(pid) and not (spare_dir / shim.EXIT).exists()
            out[spare_dir.name] = (spares.SpareKey.from_record(record), running)
        return out

    def admit(self, name: str, record: dict[str, Any], spec: dict[str, Any]) -> bool:
        """A warm spare becomes the pod ``name`` (its directory made, empty; ``record``
        and ``spec``: what the pod is and runs); False when none fits."""
        key = spares.SpareKey.of(record["job_uid"], record["role"], spec)
        ending = self._ending
        running = {n: k for n, (k, alive) in self.every().items() if alive and n not in ending}
        spare = spares.take(running, key)
        if spare is None:
            return False
        pod_dir = self._pods_dir / name
        try:
            os.rename(self.dir / spare, pod_dir)  # onto the empty dir just made
        except OSError as err:
            log.warning("local platform: spare %s not admitted as %s: %s", spare, name, err)
            return False
        write_json(pod_dir / shim.POD, record)
        admit = self.admission_file(spare)
        admit.parent.mkdir(parents=True, exist_ok=True)
        write_json(admit, spares.admission(name, spec))
        log.info("local platform: pod %s admitted warm spare %s", name, spare)
        return True

    def keep(self, jobs: Iterable[JobEntry], pods: Mapping[str, PodView]) -> None:
        """As many running spares per in-place role as it asks for; none for a job that
        ended or is gone, nor one started for what a pod of the role no longer runs."""
        views = [j for j in jobs if isinstance(j, JobView)]
        wanted = spares.wanted(views)
        by_uid = {v.uid: v for v in views}
        current: dict[tuple[str, str], spares.SpareKey] = {}
        for (uid, role), _ in wanted.items():
            template = self._template(pods, uid, role)
            if template is not None:
                current[(uid, role)] = spares.SpareKey.of(uid, role, template[1])
        keep: dict[tuple[str, str], int] = {}
        now = asyncio.get_running_loop().time()
        for name, (key, running) in self.every().items():
            spare_dir = self.dir / name
            where = (key.job_uid, key.role)
            if not running:
                if name not in self._ending:
                    log.warning("local platform: warm spare %s ended on its own", name)
                    self._failed[where] = now
                self._ending.discard(name)
                self.forget_admission(spare_dir)
                shutil.rmtree(spare_dir, ignore_errors=True)
                continue
            if name in self._ending:
                continue
            if current.get(where) != key or keep.get(where, 0) >= wanted.get(where, 0):
                self.end(name)
                continue
            keep[where] = keep.get(where, 0) + 1
        for where, count in wanted.items():
            if where not in current or keep.get(where, 0) >= count:
                continue
            failed = self._failed.get(where)
            if failed is not None and now - failed < SPARE_BACKOFF_S:
                continue
            template = self._template(pods, *where)
            if template is not None:
                self._start_spare(by_uid[where[0]].name, current[where], template[1])

    def _template(
        self, pods: Mapping[str, PodView], uid: str, role: str
    ) -> tuple[str, dict[str, Any]] | None:
        """A pod of the role to make spares of (its shim spec), None before there is one."""
        for name, pod in sorted(pods.items()):
            if pod.job_uid != uid or pod.role != role or pod.deleting:
                continue
            spec = read_json(self._pods_dir / name / shim.SPEC)
            if spec is not None:
                return name, spec
        return None

    def _start_spare(self, job: str, key: spares.SpareKey, template: dict[str, Any]) -> None:
        name = spares.spare_name(job, key.role)
        spare_dir = self.dir / name
        spare_dir.mkdir(parents=True)
        spec = spares.spare_spec(template, name, self.admission_file(name))
        (spare_dir / shim.SPEC).write_text(json.dumps(spec))
        write_json(spare_dir / spares.SPARE, {"name": name, **key.as_record()})
        self._start(name, spare_dir)
        log.info("local platform: started warm spare %s of %s/%s", name, job, key.role)

    def end(self, name: str) -> None:
        """Its shim gets SIGTERM; the next ``keep`` removes it once it ended."""
        record = read_json(self.dir / name / shim.PID)
        self._ending.add(name)
        if record is not None and shim.alive(record):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(record["pid"]), signal.SIGTERM)

    def end_all(self) -> list[str]:
        """Every spare asked to end (the operator stops with its pods); their names, for
        ``remove`` once their processes are gone."""
        names = list(self.every())
        for name in names:
            self.end(name)
        return names

    def any_running(self) -> bool:
        return any(alive for _, alive in self.every().values())

    def remove(self, names: Iterable[str]) -> None:
        for name in names:
            self.forget_admission(self.dir / name)
            shutil.rmtree(self.dir / name, ignore_errors=True)
        self._ending.clear()


__all__ = ["SPARE_BACKOFF_S", "SpareKeeper"]
