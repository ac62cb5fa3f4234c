"""The local platform's jobs: each a typed job (the port's ``JobView``, in numbers) in a
JSON file under the data dir, beside the document its user submitted.

The `job` commands (another process) and the operator share the store, so every write
happens under one file lock and bumps one resourceVersion counter, and a write that names
an older resourceVersion fails with the port's Conflict. That is what lets the
reconciler's plan-once logic (the applied plan ids written in the same write as the
change they made) hold here as everywhere.

A TrainingJob document is read once, when it is submitted (handlers.operator.document
.trainingjob.parse_job: its quantities become numbers there); from then on a change or a
status is applied to the typed job (handlers.operator.platform.changes) and written as it
is: no quantity string and no merge patch between a ScalePlan and a process. The document
as submitted is kept for the doors that show a job as one (``JobView.document``, rendered
with the job's state only when a door reads it).

A record is ``{"format": 2, "job": <JobView>, "document": <as submitted>}``; a file
without ``format`` is a TrainingJob document as the store kept jobs before (a data dir
kept across versions: `make run`'s ``.dlrover-events/``), converted when it is read and
written in the new form at its next write. A field added to ``JobView`` needs a default
for older records to read.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import re
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from dlrover_events.pods.files import read_json, write_bytes, write_json
from handlers.operator.document import trainingjob
from handlers.operator.platform.api import JobEntry
from handlers.operator.platform.bodies import (
    JobSpecChange,
    JobView,
    OperatorJobStatus,
    UnreadableJob,
)
from handlers.operator.platform.changes import apply_change, apply_status, spec_changed
from handlers.operator.platform.errors import Conflict, Invalid, InvalidJob, ObjectNotFound

NAMESPACE = "default"
#: The form of a job's record (none: a TrainingJob document, the form before it).
FORMAT = 2
#: A job object's name is a file name here: the DNS-label rule keeps it one.
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise Invalid(
            f"job name {name!r} must be a DNS label: lowercase letters, digits and '-', "
            "at most 63 characters"
        )
    return name


@dataclass(frozen=True)
class _Record:
    """A job's file: its typed job and the document it was submitted as."""

    format: int = 0
    job: JobView | None = None
    document: dict[str, Any] = field(default_factory=dict)


_DECODE_RECORD = msgspec.json.Decoder(_Record)


class ShownDocument(Mapping[str, Any]):
    """A job as a TrainingJob document, for a door that shows it: made from the typed
    job on the submitted document (trainingjob.render_job) the first time it is read."""

    def __init__(self, job: JobView, submitted: Mapping[str, Any]) -> None:
        self._job = job
        self._submitted = submitted
        self._rendered: dict[str, Any] | None = None

    @property
    def _doc(self) -> dict[str, Any]:
        if self._rendered is None:
            self._rendered = trainingjob.render_job(self._job, self._submitted)
        return self._rendered

    def __getitem__(self, key: str) -> Any:
        return self._doc[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._doc)

    def __len__(self) -> int:
        return len(self._doc)


def _shown(job: JobView, submitted: Mapping[str, Any]) -> JobView:
    return replace(job, document=ShownDocument(replace(job, document={}), submitted))


def _unreadable(name: str, meta: Mapping[str, Any], reason: str) -> UnreadableJob:
    return UnreadableJob(
        name=str(meta.get("name") or name),
        uid=str(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        reason=reason,
    )


class JobStore:
    """The typed jobs of one env of the local platform, on disk."""

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

    def _load(self, path: Path) -> tuple[JobEntry, dict[str, Any]] | None:
        """A job's file as its entry and the document it was submitted as; None when there
        is none (yet, or any more)."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        name = path.stem
        try:
            record = _DECODE_RECORD.decode(data)
        except msgspec.ValidationError as e:
            return _unreadable(name, {}, f"its record does not read: {e}"), {}
        except msgspec.DecodeError:
            return None  # not JSON: never written by write_json, which replaces whole
        if record.format == FORMAT and record.job is not None:
            return _shown(record.job, record.document), record.document
        if record.format != 0:
            return _unreadable(name, {}, f"its record has an unknown form {record.format}"), {}
        return self._converted(name, json.loads(data))

    @staticmethod
    def _converted(name: str, doc: Any) -> tuple[JobEntry, dict[str, Any]]:
        """A job kept as its TrainingJob document (before the typed records): read as
        the document it is, its status into the typed job."""
        if not isinstance(doc, dict):
            return _unreadable(name, {}, "its file is not a TrainingJob document"), {}
        meta = doc.get("metadata") or {}
        try:
            job = trainingjob.parse_job(doc)
        except InvalidJob as e:
            return _unreadable(name, meta, str(e)), doc
        submitted = {k: v for k, v in doc.items() if k != "status"}
        return _shown(job, submitted), submitted

    def get(self, name: str) -> JobEntry | None:
        """The job (one that does not read: what it is and why); None when there is none.
        Invalid when ``name`` cannot be a job's."""
        found = self._load(self._path(name))
        return None if found is None else found[0]

    def list(self) -> list[JobEntry]:
        found = (self._load(path) for path in sorted(self.jobs_dir.glob("*.json")))
        return [entry for entry, _ in filter(None, found)]

    def submitted(self, name: str) -> dict[str, Any] | None:
        """The document the job was submitted as (None: no such job)."""
        found = self._load(self._path(name))
        return None if found is None else found[1]

    def _current(self, name: str) -> tuple[JobView, dict[str, Any]]:
        found = self._load(self._path(name))
        if found is None:
            raise ObjectNotFound(f"trainingjob {name} not found")
        job, submitted = found
        if isinstance(job, UnreadableJob):
            raise Invalid(f"trainingjob {name} does not read: {job.reason}")
        return job, submitted

    # -- writes ---------------------------------------------------------------------------

    def _write(self, job: JobView, submitted: Mapping[str, Any]) -> JobView:
        """Only under ``locked()``: the job as its record says it, and as read back."""
        record = _Record(FORMAT, replace(job, document={}), dict(submitted))
        write_bytes(self._path(job.name), msgspec.json.encode(record))
        return _shown(job, submitted)

    def create(self, body: Mapping[str, Any]) -> JobView:
        """The job of a TrainingJob document: read once, here (Invalid when the decisions
        could not read it: nothing is kept), with its uid and first version."""
        doc = copy.deepcopy(dict(body))
        doc.pop("status", None)
        meta = doc.setdefault("metadata", {})
        name = check_name(str(meta.get("name") or ""))
        try:
            job = trainingjob.parse_job(doc)
        except InvalidJob as e:
            raise Invalid(f"invalid {trainingjob.KIND}: {e}") from None
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
            job = replace(
                job,
                namespace=NAMESPACE,
                uid=meta["uid"],
                generation=1,
                resource_version=meta["resourceVersion"],
            )
            return self._write(job, doc)

    def change(self, name: str, change: JobSpecChange) -> JobView:
        """``change`` made on the job, in one write, on the version it names (else
        Conflict): its generation moves when its spec does."""
        with self.locked():
            job, submitted = self._current(name)
            wanted = change.resource_version
            if wanted and wanted != job.resource_version:
                raise Conflict(
                    f"trainingjob {name} changed: version {job.resource_version}, "
                    f"the change is for {wanted}"
                )
            after = apply_change(job, change)
            generation = job.generation + 1 if spec_changed(job, after) else job.generation
            after = replace(after, resource_version=self.next_version(), generation=generation)
            return self._write(after, submitted)

    def set_status(self, name: str, status: OperatorJobStatus) -> JobView:
        """``status`` said on the job (like Kubernetes' status subresource: on whatever
        version it is, its spec left alone)."""
        with self.locked():
            job, submitted = self._current(name)
            after = replace(apply_status(job, status), resource_version=self.next_version())
            return self._write(after, submitted)

    def delete(self, name: str) -> bool:
        with self.locked():
            path = self._path(name)
            if not path.exists():
                return False
            path.unlink()
            self.next_version()
            return True


__all__ = [
    "FORMAT",
    "NAMESPACE",
    "JobStore",
    "ShownDocument",
    "check_name",
    "read_json",
    "write_bytes",
    "write_json",
]
