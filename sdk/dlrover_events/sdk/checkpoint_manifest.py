"""What makes a checkpoint complete, and which one a job resumes from (pure, no torch, no I/O).

A checkpoint of ``ElasticCheckpoint`` is a directory under the job's root,
``<root>/step-<12 digits>/``: every rank's part in torch.distributed.checkpoint's layout
(``__<rank>_<n>.distcp`` and ``.metadata``) and, written last by rank 0 once every part is
persisted, ``manifest.json``. The manifest is the commit: a directory without one is a
persist that never finished (the process was killed mid-write) and is passed over; a
manifest that does not parse, or whose files are missing or shorter than it says, is
refused with one line (``CheckpointError``) rather than loaded half.

The torch side (``dlrover_events.sdk.torch.checkpoint``) does the I/O; what is decided
here is tested directly.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dlrover_events.errors import UserError
from dlrover_events.sdk.identity import JobIdentity
from schemas.checkpoints import CheckpointCommitted, CheckpointReason

#: The layout's version: 2 is per-rank DCP parts under a manifest (1 was one torch.save
#: file written by rank 0, which ``ElasticCheckpoint`` still reads).
CHECKPOINT_FORMAT = 2
LEGACY_FORMAT = 1
MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"^step-(\d{12})$")
_ID_UNSAFE = re.compile(r"[^A-Za-z0-9._:-]+")


class CheckpointError(UserError):
    """A checkpoint that cannot be loaded as it is (a torn manifest, a missing part); the
    message names it and what to do, in one line."""


class SaveReason(StrEnum):
    """Why a checkpoint was saved (the values of schemas.checkpoints.CheckpointReason)."""

    PERIODIC = "periodic"
    SIGTERM = "sigterm"
    PLAN = "plan"
    MANUAL = "manual"


class Manifest(BaseModel):
    """What rank 0 writes last: the checkpoint is whole, and what it holds."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    kind: Literal["dlrover-events-checkpoint"] = "dlrover-events-checkpoint"
    format: int = Field(default=CHECKPOINT_FORMAT, ge=CHECKPOINT_FORMAT, le=CHECKPOINT_FORMAT)
    checkpoint_id: str = Field(min_length=1, max_length=256)
    job: str = ""
    step: int = Field(ge=0)
    world_size: int = Field(ge=1)
    saved_at: float = Field(ge=0)
    reason: SaveReason = SaveReason.PERIODIC
    #: seconds the training step waited (the copy to host memory), and the persist behind it
    blocking_s: float = Field(ge=0)
    persist_s: float = Field(ge=0)
    #: every part's relative path and the bytes it holds at least
    files: dict[str, int] = Field(min_length=1)
    sharded: bool = False
    plan_id: str | None = None
    metrics: dict[str, float] = Field(default_factory=dict)

    @property
    def size_bytes(self) -> int:
        return sum(self.files.values())


def step_dir(step: int) -> str:
    """The directory name of step ``step``'s checkpoint: sorts by step as text too."""
    if step < 0:
        raise ValueError(f"a step is >= 0, got {step}")
    return f"step-{step:012d}"


def step_of(name: str) -> int | None:
    """The step of a checkpoint directory's name (its last path part), None for others."""
    m = _STEP_DIR.match(name.rstrip("/").rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def checkpoint_id(job: str, step: int, suffix: str | None = None) -> str:
    """``<job>-<step>-<suffix>``: unique in an env (the suffix tells two runs of a job that
    saved the same step apart), in the characters the catalog accepts."""
    safe = _ID_UNSAFE.sub("_", job).strip("._:-") or "job"
    return f"{safe[:200]}-{step}-{suffix or secrets.token_hex(4)}"


def parse_manifest(text: str | bytes, where: str) -> Manifest:
    """The manifest of the checkpoint at ``where``, or CheckpointError saying it is refused."""
    try:
        return Manifest.model_validate_json(text)
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ())) or "the file"
        why = "torn (not whole JSON)" if first["type"] == "json_invalid" else "invalid"
        raise CheckpointError(
            f"checkpoint {where} refused: its {MANIFEST} is {why} ({loc}: {first['msg']}); "
            "remove that directory to resume from the one before"
        ) from None


def missing_parts(manifest: Manifest, sizes: Mapping[str, int]) -> list[str]:
    """The parts the manifest names that ``sizes`` (relative path -> bytes on storage)
    lacks or holds shorter: a checkpoint with any is not loaded."""
    problems = []
    for name, size in sorted(manifest.files.items()):
        found = sizes.get(name)
        if found is None:
            problems.append(f"{name} missing")
        elif found < size:
            problems.append(f"{name} has {found} bytes of {size}")
    return problems


def refuse_parts(manifest: Manifest, sizes: Mapping[str, int], where: str) -> None:
    """CheckpointError when a part the manifest names is missing or short."""
    problems = missing_parts(manifest, sizes)
    if problems:
        more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
        raise CheckpointError(
            f"checkpoint {where} refused: {problems[0]}{more}; "
            "remove that directory to resume from the one before"
        )


def newest_first(names: list[str]) -> list[tuple[int, str]]:
    """The checkpoint directories among ``names`` (a listing of the root), newest first."""
    found = [(s, n) for n in names if (s := step_of(n)) is not None]
    return sorted(found, reverse=True)


def part_sizes(storage_data: Mapping[object, object]) -> dict[str, int]:
    """The bytes each part file holds at least, from DCP's metadata (each item's relative
    path, offset and length): what the manifest records and a load checks."""
    sizes: dict[str, int] = {}
    for info in storage_data.values():
        path = getattr(info, "relative_path", None)
        if path is None:
            continue
        end = int(getattr(info, "offset", 0)) + int(getattr(info, "length", 0))
        sizes[str(path)] = max(sizes.get(str(path), 0), end)
    return sizes


def committed_event(
    manifest: Manifest,
    url: str,
    identity: JobIdentity,
    experiment: str | None = None,
    trial: int | None = None,
) -> CheckpointCommitted:
    """The catalog's event for a committed checkpoint, as rank 0 reports it."""
    return CheckpointCommitted(
        env=identity.env,
        job=identity.job,
        source=identity.source,
        checkpoint_id=manifest.checkpoint_id,
        url=url,
        step=manifest.step,
        experiment=experiment,
        trial=trial,
        world_size=manifest.world_size,
        plan_id=manifest.plan_id,
        metrics=dict(manifest.metrics),
        size_bytes=manifest.size_bytes,
        blocking_s=manifest.blocking_s,
        persist_s=manifest.persist_s,
        format="dcp",
        format_version=CHECKPOINT_FORMAT,
        reason=CheckpointReason(manifest.reason.value),
    )


__all__ = [
    "CHECKPOINT_FORMAT",
    "LEGACY_FORMAT",
    "MANIFEST",
    "CheckpointError",
    "Manifest",
    "SaveReason",
    "checkpoint_id",
    "committed_event",
    "missing_parts",
    "newest_first",
    "parse_manifest",
    "part_sizes",
    "refuse_parts",
    "step_dir",
    "step_of",
]
