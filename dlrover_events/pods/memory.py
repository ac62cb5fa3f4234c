"""Per-node memory limits of the local platform: a cgroup where the machine lets us make
one, else RLIMIT_AS, and the operator says which.

A cgroup limits what the node's processes really use (resident memory, all of the node's
processes together) and the kernel's OOM killer ends the largest of them, which the
cgroup counts, so an OOM kill is a fact we can read. RLIMIT_AS only caps each process's
address space: an allocation past it fails inside the process (torch raises, the SDK's
hook reports a host OOM itself), and a process reserves far more address space than it
uses, so the limit given must be generous. Both are set in the child before it runs the
node's command, so nothing of the node runs unlimited.
"""

from __future__ import annotations

import contextlib
import os
import resource
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
#: glibc malloc arenas a node's process may make under RLIMIT_AS (``child_env``)
MALLOC_ARENAS = "2"
#: our cgroups live under one parent, named so an operator's leftovers are recognisable
PARENT = "dlrover-events"


class Enforcement(StrEnum):
    CGROUP_V2 = "cgroup-v2"
    CGROUP_V1 = "cgroup-v1"
    RLIMIT_AS = "rlimit-as"
    NONE = "none"


def _v2_root() -> Path | None:
    controllers = CGROUP_ROOT / "cgroup.controllers"
    try:
        if "memory" in controllers.read_text().split():
            return CGROUP_ROOT
    except OSError:
        return None
    return None


def _v1_root() -> Path | None:
    root = CGROUP_ROOT / "memory"
    return root if (root / "memory.limit_in_bytes").exists() else None


def _writable_parent(root: Path) -> Path | None:
    parent = root / PARENT
    try:
        parent.mkdir(exist_ok=True)
        if root == _v2_root():
            # children of our parent may only limit memory once it is delegated to them
            with contextlib.suppress(OSError):
                (root / "cgroup.subtree_control").write_text("+memory")
            with contextlib.suppress(OSError):
                (parent / "cgroup.subtree_control").write_text("+memory")
        probe = parent / f"probe-{os.getpid()}"
        probe.mkdir(exist_ok=True)
        probe.rmdir()
    except OSError:
        return None
    return parent


def available() -> Enforcement:
    """The strongest enforcement this machine allows us."""
    v2 = _v2_root()
    if v2 is not None and _writable_parent(v2) is not None:
        return Enforcement.CGROUP_V2
    v1 = _v1_root()
    if v1 is not None and _writable_parent(v1) is not None:
        return Enforcement.CGROUP_V1
    return Enforcement.RLIMIT_AS


@dataclass(frozen=True)
class NodeMemory:
    """The memory limit of one node (pod) of the local platform."""

    how: Enforcement
    limit: int | None
    cgroup: Path | None = None

    @classmethod
    def prepare(cls, name: str, limit: int | None, how: Enforcement) -> NodeMemory:
        """Make the node's cgroup (in the parent process, before the child starts)."""
        if not limit:
            return cls(Enforcement.NONE, None)
        if how in (Enforcement.CGROUP_V2, Enforcement.CGROUP_V1):
            root = _v2_root() if how == Enforcement.CGROUP_V2 else _v1_root()
            assert root is not None
            group = root / PARENT / name
            group.mkdir(parents=True, exist_ok=True)
            limit_file = "memory.max" if how == Enforcement.CGROUP_V2 else "memory.limit_in_bytes"
            (group / limit_file).write_text(str(limit))
            if how == Enforcement.CGROUP_V2:
                with contextlib.suppress(OSError):
                    (group / "memory.swap.max").write_text("0")
            return cls(how, limit, group)
        return cls(Enforcement.RLIMIT_AS, limit)

    def child_env(self, env: dict[str, str]) -> dict[str, str]:
        """The node's variables; under RLIMIT_AS with glibc's malloc arenas capped
        (``MALLOC_ARENA_MAX``, unless the node sets it): each thread that allocates gets an
        arena of its own, 64 MB of address space reserved, up to 8 per core. Measured
        under a 4 GiB RLIMIT_AS with torch imported: 14 more threads could start, 102 with
        two arenas; an elastic worker at world size 3 on the hosts platform died starting
        its checkpoint's thread ("can't start new thread", issue 35)."""
        if self.how == Enforcement.RLIMIT_AS and self.limit and "MALLOC_ARENA_MAX" not in env:
            return {**env, "MALLOC_ARENA_MAX": MALLOC_ARENAS}
        return env

    def enter(self) -> None:
        """In the child, before exec: join the cgroup, or cap the address space."""
        if self.cgroup is not None:
            (self.cgroup / "cgroup.procs").write_text(str(os.getpid()))
        elif self.how == Enforcement.RLIMIT_AS and self.limit:
            resource.setrlimit(resource.RLIMIT_AS, (self.limit, self.limit))

    def oom_kills(self) -> int:
        """How many of the node's processes the kernel killed for its limit (cgroups)."""
        if self.cgroup is None:
            return 0
        name = "memory.events" if self.how == Enforcement.CGROUP_V2 else "memory.oom_control"
        try:
            for line in (self.cgroup / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            return 0
        return 0

    def remove(self) -> None:
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                self.cgroup.rmdir()


__all__ = ["Enforcement", "NodeMemory", "available"]
