"""The small JSON files a pod's directory holds, written so that another process (the
operator, a `job` command, the agent, the pod's shim) reads the old file or the new one,
never half of one."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object written by ``write_json``; None when there is none (yet, or any more)."""
    try:
        got: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return got


def write_json(path: Path, value: Any) -> None:
    """Atomic: a reader sees the old file or the new one, never half of one."""
    write_bytes(path, json.dumps(value).encode())


def write_bytes(path: Path, data: bytes) -> None:
    """``data`` in ``path``, atomically (see ``write_json``)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


__all__ = ["read_json", "write_bytes", "write_json"]
