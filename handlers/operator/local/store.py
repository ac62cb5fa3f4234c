"""The local platform's job objects: TrainingJobs as JSON files under the data dir.

The local platform's store of jobs: the `job` commands (another process) and the operator
share it, so every write happens under one file lock and bumps one resourceVersion
counter, and a write that names an older resourceVersion fails with the port's
Conflict. That is what lets the reconciler's plan-once logic (the applied plan ids
written on the job in the same patch as its change) hold here as everywhere. A job is
kept as its TrainingJob document (handlers.operator.document.trainingjob reads and patches it).
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
import re
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from handlers.operator.platform.errors import Conflict, Invalid, ObjectNotFound

NAMESPACE = "default"
#: A job object's name is a file name here: the DNS-label rule keeps it one.
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge key by key, null deletes, the rest replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise Invalid(
            f"job name {name!r} must be a DNS label: lowercase letters, digits and '-', "
            "at most 63 characters"
        )
    return name


class JobStore:
    """TrainingJob objects of one env of the local platform, on disk."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.jobs_dir = root / "jobs"
        self.pods_dir = root / "pods"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.pods_dir.mkdir(parents=True, exist_ok=True)
        self._lock_path = root / "lock"
        self._counter = root / "resource-version"

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        with open(self._lock_path, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def next_version(self) -> str:
        """Only under ``locked()``."""
        try:
            current = int(self._counter.read_text() or "0")
        except FileNotFoundError:
            current = 0
        write_json(self._counter, current + 1)
        return str(current + 1)

    def _path(self, name: str) -> Path:
        return self.jobs_dir / f"{check_name(name)}.json"

    # -- reads ----------------------------------------------------------------------------

    def get(self, name: str) -> dict[str, Any] | None:
        return read_json(self._path(name))

    def list(self) -> list[dict[str, Any]]:
        found = (read_json(path) for path in sorted(self.jobs_dir.glob("*.json")))
        return [obj for obj in found if obj is not None]

    # -- writes ---------------------------------------------------------------------------

    def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(dict(body))
        meta = obj.setdefault("metadata", {})
        name = check_name(str(meta.get("name") or ""))
        with self.locked():
            path = self._path(name)
            if path.exists():
                raise Conflict(f"trainingjob {name} already exists")
            meta.update(
                namespace=NAMESPACE,
                uid=str(uuid.uuid4()),
                generation=1,
                creationTimestamp=_now(),
                resourceVersion=self.next_version(),
            )
            obj.pop("status", None)
            write_json(path, obj)
        return obj

    def patch(self, name: str, patch: Mapping[str, Any], *, status: bool = False) -> dict[str, Any]:
        """A merge patch of the object (``status``: of its status only, like the
        subresource). A patch naming a resourceVersion applies only on that version."""
        with self.locked():
            current = self.get(name)
            if current is None:
                raise ObjectNotFound(f"trainingjob {name} not found")
            meta = current["metadata"]
            wanted = (patch.get("metadata") or {}).get("resourceVersion")
            if wanted and wanted != meta["resourceVersion"]:
                raise Conflict(
                    f"trainingjob {name} changed: version {meta['resourceVersion']}, "
                    f"the patch is for {wanted}"
                )
            if status:
                new = dict(current)
                new["status"] = merge_patch(current.get("status") or {}, patch.get("status"))
            else:
                new = merge_patch(current, {k: v for k, v in patch.items() if k != "status"})
                new["metadata"] = {**new["metadata"], "uid": meta["uid"], "name": meta["name"]}
                if new.get("spec") != current.get("spec"):
                    new["metadata"]["generation"] = int(meta.get("generation") or 1) + 1
            new["metadata"]["resourceVersion"] = self.next_version()
            write_json(self._path(name), new)
            return new

    def delete(self, name: str) -> bool:
        with self.locked():
            path = self._path(name)
            if not path.exists():
                return False
            path.unlink()
            self.next_version()
            return True


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object written by ``write_json``; None when there is none (yet, or any more)."""
    try:
        got: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return got


def write_json(path: Path, value: Any) -> None:
    """Atomic: a reader (another process among the commands, the operator and the nodes'
    shims) sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


__all__ = [
    "NAMESPACE",
    "JobStore",
    "check_name",
    "merge_patch",
    "read_json",
    "write_json",
]
