"""One node (pod) as processes: ``python -m dlrover_events.pods.shim POD_DIR``.

Whoever runs pods (the local platform's operator, a host's agent) starts this small
process per node instead of the node's command itself, so that a node outlives it (a
restarted operator or agent re-adopts it from its pid file)
and still leaves its ending behind: the shim waits for the command, and writes how it
ended (exit code, signal, OOM kill) to ``exit.json``, which any later operator reads.
It also owns the node's memory limit and its grace period: SIGTERM is passed on to the
command alone (torchrun's agent then stops its workers, each with one SIGTERM, in which
they save their checkpoint), and whatever of the node still runs after the grace period
is killed, so no process of a node survives its pod.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from dlrover_events.pods.files import write_json
from dlrover_events.pods.memory import Enforcement, NodeMemory

# The files of a node's directory (a pod's or a warm spare's)
SPEC = "spec.json"
EXIT = "exit.json"
OOM = "oom.json"
LOG = "log"
#: what a pod is (its job, role, rank, index and resources), in numbers: the operator's
POD = "pod.json"
#: the shim's pid and start time, written by the operator that started it
PID = "pid"
_PR_SET_CHILD_SUBREAPER = 36
#: what ``python -m`` runs
MODULE = "dlrover_events.pods.shim"


def alive(record: Mapping[str, Any]) -> bool:
    """The process of a pid file is still the shim that was started (pids are reused)."""
    try:
        proc = psutil.Process(int(record["pid"]))
        if abs(proc.create_time() - float(record["create_time"])) > 0.05:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def start(pod_dir: Path, python: str = sys.executable) -> subprocess.Popen[bytes]:
    """The shim of the pod in ``pod_dir`` (its ``SPEC`` written), in a session of its own:
    it outlives whoever started it, who (or whose successor) adopts it again from the pid
    and start time left in ``PID``."""
    proc = subprocess.Popen(
        [python, "-m", MODULE, str(pod_dir)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(pod_dir / "shim.log", "ab"),  # noqa: SIM115 - the shim's own
        start_new_session=True,
    )
    try:
        created = psutil.Process(proc.pid).create_time()
    except psutil.Error:
        created = 0.0
    write_json(pod_dir / PID, {"pid": proc.pid, "create_time": created})
    return proc


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _signal_all(procs: list[psutil.Process], sig: int) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(sig)


def _become_subreaper() -> None:
    """Processes the node's command leaves behind (torchrun's workers, when the agent
    dies first) become ours instead of init's, so the shim can end them."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class _Here:
    """Where this node's directory is now: a warm spare's moves when a pod admits it
    (``spares.py``), and its ending must be written where the pod is."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._fd: int | None = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            self._fd = None

    def __truediv__(self, name: str) -> Path:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                return Path(os.readlink(f"/proc/self/fd/{self._fd}")) / name
        return self.path / name


def main(pod_dir: Path) -> int:
    _become_subreaper()
    here = _Here(pod_dir)
    spec = json.loads((pod_dir / SPEC).read_text())
    memory = NodeMemory.prepare(
        spec["name"], spec.get("memory"), Enforcement(spec.get("enforcement", "none"))
    )
    grace_s = float(spec.get("grace_s", 30))
    log = open(pod_dir / LOG, "ab", buffering=0)  # noqa: SIM115 - the child writes to it
    child = subprocess.Popen(
        spec["command"],
        cwd=spec.get("cwd") or None,
        env=memory.child_env(spec["env"]),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=memory.enter,
    )
    stopping = threading.Event()

    def stop(signum: int, _frame: Any) -> None:
        if stopping.is_set():
            return
        stopping.set()
        # SIGTERM to the command alone, as Kubernetes signals a container's first
        # process: torchrun's agent then stops its workers with one SIGTERM each, and
        # each saves its checkpoint (a second SIGTERM, had the shim sent its own too,
        # kills a worker before it saves). Whatever is left after the grace period is
        # killed, the whole tree.
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signal.SIGTERM)

        def kill_late() -> None:
            if child.poll() is None:
                time.sleep(grace_s)
            _signal_all(_tree(child.pid), signal.SIGKILL)

        threading.Thread(target=kill_late, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    seen_ooms = 0
    while True:
        try:
            code = child.wait(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            kills = memory.oom_kills()
            if kills > seen_ooms:
                # A process of the node was killed for the node's limit while the node
                # goes on (torchrun restarts its worker): the operator reports it.
                seen_ooms = kills
                write_json(here / OOM, {"oom_kills": kills, "at": time.time()})
    # Nothing of the node survives it: workers torchrun left behind go too.
    leftovers = psutil.Process().children(recursive=True)
    _signal_all(leftovers, signal.SIGKILL)
    psutil.wait_procs(leftovers, timeout=5)
    oom_kills = memory.oom_kills()
    signum = -code if code < 0 else None
    exit_code = 128 + signum if signum is not None else code
    reason = "Completed" if exit_code == 0 else "Error"
    if oom_kills > seen_ooms or (exit_code == 137 and oom_kills):
        reason = "OOMKilled"
    elif stopping.is_set():
        reason = "Terminated"
    write_json(
        here / EXIT,
        {
            "exitCode": exit_code,
            "signal": signum,
            "reason": reason,
            "oomKills": oom_kills,
            "memoryLimit": memory.how.value,
            "finishedAt": time.time(),
        },
    )
    memory.remove()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
