"""Ending a worker process without the interpreter's finalization of torch.

A resize on the restart path waits for the workers to end twice: torchrun's agent stops
them (SIGTERM) and waits for them before it rendezvous again, and after a shrink the
survivors' agents only restart once their workers, which lost a peer, have ended. A worker
that returns from its loop still spends its end in finalization: with torch, DDP and an
optimizer loaded (an optimizer imports ``torch._dynamo``), 1.4 s alone on this machine and
2-3 s when a node's workers end together on two cores, measured. Every second of it is a
second the whole job does not train, so a worker whose work is done ends at once.

Finalization is also where a gloo job can abort. A gloo process group has no shutdown: its
worker threads live on after ``destroy_process_group``, and one that releases its last
collective's tensors as the interpreter finalizes must take the GIL to free their Python
objects, which a finalizing interpreter refuses by ending the thread; the unwind crosses
C++ and the process aborts ("terminate called without an active exception", SIGABRT).
Seen here in 1 of about 50 runs of a 4-rank FSDP2 job on two loaded cores, its core's
backtrace in ``~AsyncAllgatherCoalescedWork`` under ``ProcessGroupGloo::runLoop``; torch
discussed a remedy (an atexit ``destroy_process_group``, pytorch#179291) and did not take it.
Without finalization there is no such moment. For the same reason the SDK's SIGTERM
handlers hold their objects weakly (``weak_handler``): a handler is kept until the
finalization, and an object it held, with the job's model, was freed only then.

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
import signal
import sys
import threading
import weakref
from collections.abc import Callable
from types import FrameType
from typing import NoReturn

Handler = Callable[[int, FrameType | None], None]

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


def weak_handler(bound: Handler) -> Handler:
    """A signal handler that calls ``bound`` (a bound method) while its object lives, and
    once it is gone lets the signal do what it does by default. The signal module keeps
    its handler until the interpreter's finalization: a handler holding a checkpoint,
    and through it the model and the optimizer, made them be freed only there (see the
    module)."""
    method = weakref.WeakMethod(bound)

    def handler(signum: int, frame: FrameType | None) -> None:
        live = method()
        if live is not None:
            live(signum, frame)
            return
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    return handler


__all__ = ["THREAD_JOIN_S", "Handler", "exit_promptly", "weak_handler"]
