"""exit_promptly ends a worker as the interpreter would, less its finalization: what the
process still had to say is said, its code is kept, and module teardown does not run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

WORKER = textwrap.dedent(
    """
    import atexit, sys, threading, time
    from dlrover_events.sdk.torch.exiting import exit_promptly

    class Teardown:
        def __del__(self):
            sys.stdout.write("finalized\\n")

    kept = Teardown()  # collected only by the interpreter's finalization
    atexit.register(lambda: sys.stdout.write("atexit ran\\n"))

    def late():
        time.sleep(0.3)
        sys.stdout.write("thread done\\n")

    threading.Thread(target=late).start()  # non-daemon: still delivering
    sys.stdout.write("buffered, no newline")
    exit_promptly(3)
    """
)


def test_a_prompt_exit_keeps_the_code_the_output_the_threads_and_atexit() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WORKER],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout.startswith("buffered, no newline")
    assert "thread done\n" in done.stdout and "atexit ran\n" in done.stdout
    assert "finalized" not in done.stdout  # no module teardown
    assert done.stdout.index("thread done") < done.stdout.index("atexit ran")
