"""`model register` and `checkpoint list` refuse what they cannot do in one line, exit 2,
before they reach a database (none is configured here)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

MAIN = [sys.executable, "-c", "from dlrover_events.cli.app import main; main()"]
NOWHERE = {
    **{k: v for k, v in os.environ.items() if not k.startswith("DLROVER_EVENTS_")},
    "DLROVER_EVENTS_BOOTSTRAP_SERVERS": "127.0.0.1:1",
    "DLROVER_EVENTS_PG_DSN": "postgresql://nobody@127.0.0.1:1/none",
}


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["model", "register", "m"], "give one of --from CHECKPOINT or --best EXPERIMENT"),
        (["checkpoint", "list"], "name a job, or an experiment with --experiment"),
    ],
)
def test_one_line(args: list[str], says: str) -> None:
    done = subprocess.run(
        [*MAIN, *args], capture_output=True, text=True, timeout=120, env=NOWHERE, check=False
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and says in lines[0], done.stderr
