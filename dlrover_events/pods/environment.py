"""What every pod's process starts with on a machine that runs pods as processes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: What a pod's process inherits from its starter's environment besides its own variables.
PASSED = ("HOME", "LANG", "LC_ALL", "TMPDIR", "USER")


def node_env(bootstrap_servers: str, python: str = sys.executable) -> dict[str, str]:
    """``python``'s tools first on PATH (so `torchrun` and `python` are the install's), and
    where the bus is."""
    bin_dir = str(Path(python).parent)
    env = {k: os.environ[k] for k in PASSED if k in os.environ}
    env["PATH"] = os.pathsep.join([bin_dir, os.environ.get("PATH", "/usr/bin:/bin")])
    env["PYTHONUNBUFFERED"] = "1"
    env["DLROVER_EVENTS_BOOTSTRAP_SERVERS"] = bootstrap_servers
    return env


__all__ = ["PASSED", "node_env"]
