"""exit_promptly ends a worker as the interpreter would, less its finalization: what the
process still had to say is said, its code is kept, and module teardown does not run."""

from __future__ import annotations

import signal
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


CHILD = textwrap.dedent(
    """
    import multiprocessing, sys
    from dlrover_events.sdk.torch.exiting import exit_promptly

    def worker(code, said):
        try:
            exit_promptly(code)
        except SystemExit as e:
            said.put(("SystemExit", e.code))
            raise

    if __name__ == "__main__":
        ctx = multiprocessing.get_context("forkserver")
        for code in (0, 3):
            said = ctx.SimpleQueue()
            p = ctx.Process(target=worker, args=(code, said))
            p.start()
            p.join(60)
            print(code, p.exitcode, None if said.empty() else said.get())
    """
)


def test_in_a_multiprocessing_child_a_clean_end_is_a_system_exit(tmp_path: Path) -> None:
    """torchrun's --run-path runs the script in a multiprocessing child, whose agent waits
    for the function to return: a clean end raises SystemExit(0) (torch takes it for a
    return), any other code still ends the process at once with that code."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["0 0 ('SystemExit', 0)", "3 3 None"], done.stdout


HANDLED = textwrap.dedent(
    """
    import gc, os, signal, sys, weakref
    import torch
    from dlrover_events.sdk.torch import ElasticCheckpoint

    model = torch.nn.Linear(2, 1)
    ck = ElasticCheckpoint(sys.argv[1], model, torch.optim.SGD(model.parameters(), lr=0.1))
    os.kill(os.getpid(), signal.SIGTERM)  # while it lives: the loop is asked to stop
    print("stop asked", ck.stop_requested, flush=True)
    gone = weakref.ref(ck)
    del ck
    gc.collect()
    print("freed", gone() is None, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)  # once it is gone: what SIGTERM does by default
    print("still here", flush=True)
    """
)


def test_the_sigterm_handler_keeps_no_checkpoint_alive(tmp_path: Path) -> None:
    """The signal module keeps a handler until the interpreter's finalization: a checkpoint
    its handler held (with the model and the optimizer) was freed only there, where a gloo
    worker thread releasing its last collective's tensors aborts the process (exiting.py)."""
    done = subprocess.run(
        [sys.executable, "-c", HANDLED, str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.stdout.splitlines() == ["stop asked True", "freed True"], done.stderr
    assert done.returncode == -signal.SIGTERM, done.stderr
