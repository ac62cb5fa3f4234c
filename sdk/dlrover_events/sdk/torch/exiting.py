"""Ending a worker process without the interpreter's finalization of torch.

A resize on the restart path waits for the workers to end twice: torchrun's agent stops
them (SIGTERM) and waits for them before it rendezvous again, and after a shrink the
survivors' agents only restart once their workers, which lost a peer, have ended. A worker
that returns from its loop still spends its end in finalization: with torch, DDP and an
optimizer loaded (an optimizer imports ``torch._dynamo``), 1.4 s alone on this machine and
2-3 s when a node's workers end together on two cores, measured. Every second of it is a
second the whole job does not train, so a worker whose work is done ends at once.

A worker that is a multiprocessing child (torchrun's ``--run-path`` with a fork or
forkserver start method runs the script in one) ends well by ``SystemExit(0)`` instead:
its agent waits for the function to return (torch takes that exit for a return), and
multiprocessing ends the child with ``os._exit`` after it, without finalization either.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import sys
import threading
from typing import NoReturn

#: Seconds each non-daemon thread gets to end (a reporter still delivering, say): the
#: interpreter would wait for them without limit.
THREAD_JOIN_S = 10.0


def exit_promptly(code: int | None) -> NoReturn:
    """End this process with ``code`` as the interpreter would, less its finalization:
    the non-daemon threads are joined (each for at most ``THREAD_JOIN_S``), the atexit
    functions run (logging's flush among them), the standard streams are flushed, then
    ``os._exit``. Call it when the work is saved: a checkpoint written, the reporter
    closed. ``sys.exit(main())`` becomes ``exit_promptly(main())``. In a multiprocessing
    child a code of 0 raises ``SystemExit(0)`` after the same steps (the module's
    docstring says why)."""
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon:
            thread.join(THREAD_JOIN_S)
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # closed, or its reader gone
                stream.flush()
        if not code and multiprocessing.parent_process() is not None:
            raise SystemExit(0)
        os._exit(code or 0)


__all__ = ["THREAD_JOIN_S", "exit_promptly"]
