"""Members of an in-place group as real processes, one harness for the tests that need
several: each rank runs `script` with ``python -c`` and prints its result as its last
line, one JSON object."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlrover_events.runtime.embedded import free_port

REPO = Path(__file__).resolve().parents[3]


def run_members(
    script: str, args: Sequence[str], *, members: int = 3, timeout_s: float = 120.0
) -> dict[int, dict[str, Any]]:
    """Run `members` ranks of `script` (argv: rank, a free port, then `args`) to their end;
    each must exit 0. Their results by rank."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(r), str(port), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        for r in range(members)
    ]
    outs: dict[int, dict[str, Any]] = {}
    try:
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=timeout_s)
            assert p.returncode == 0, (r, err[-3000:])
            outs[r] = json.loads(out.strip().splitlines()[-1])
    finally:
        for p in procs:
            p.kill()
    return outs
