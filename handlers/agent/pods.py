"""The pods an agent runs, as directories under its working directory: each a shim
(dlrover_events.pods.shim) around the pod's command, in a process group of its own, with
its pid file (pid and start time), its log and, once it ended, its ``exit.json``.

Everything is in files, so an agent that restarts (an upgrade, a crash) finds the pods its
predecessor started still running and takes them back from their pid files: no training
ends with the agent. What to run comes from the operator's orders (schemas.hosts
``OrderedPod``); ``apply`` makes the directories match them, ``states`` says what each pod
is doing now.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from dlrover_events.pods import shim
from dlrover_events.pods.files import read_json, write_json
from dlrover_events.pods.memory import Enforcement
from schemas.hosts import AgentPod, OrderedPod

log = logging.getLogger(__name__)

#: The variable that binds a pod's processes to the GPUs it was given.
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
#: What the operator ordered, as the pod's directory keeps it.
ORDER = "order.json"


class HostPods:
    """The pods under ``root``: started, followed, stopped and removed as ordered.

    ``base_env``: what every pod's process starts with (PATH, the bus); ``gpus``: whether
    the slots are GPUs (then a pod's slots become its CUDA_VISIBLE_DEVICES)."""

    def __init__(
        self,
        root: Path,
        *,
        base_env: Mapping[str, str],
        gpus: bool,
        enforcement: Enforcement = Enforcement.NONE,
        python: str = sys.executable,
    ) -> None:
        self.root = root
        self.pods_dir = root / "pods"
        self.logs_dir = root / "logs"
        self.pods_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.base_env = dict(base_env)
        self.gpus = gpus
        self.enforcement = enforcement
        self.python = python
        #: shims this agent started (reaped here; a predecessor's are init's to reap)
        self._started: dict[str, subprocess.Popen[bytes]] = {}

    def adopted(self) -> list[str]:
        """The pods running now that this agent did not start: its predecessor's."""
        return [
            d.name
            for d in sorted(self.pods_dir.iterdir())
            if d.name not in self._started and self._running(d)
        ]

    # -- orders ---------------------------------------------------------------------------

    def apply(self, ordered: Sequence[OrderedPod]) -> None:
        """Start what is ordered and not there, stop what is ordered stopped or not
        ordered at all, and remove a pod that ended once the orders no longer name it."""
        for name, proc in list(self._started.items()):
            if proc.poll() is not None:
                del self._started[name]
        wanted = {o.name: o for o in ordered}
        for order in ordered:
            pod_dir = self.pods_dir / order.name
            if order.deleting:
                self._terminate(pod_dir)
                continue
            if pod_dir.exists() and self._uid(pod_dir) != order.uid:
                # an earlier pod of the name (a rank scaled away and back): it goes first
                if self._running(pod_dir):
                    self._terminate(pod_dir)
                    continue
                self._remove(pod_dir)
            if not pod_dir.exists():
                self._start(pod_dir, order)
        for pod_dir in sorted(self.pods_dir.iterdir()):
            if pod_dir.name in wanted:
                continue
            if self._running(pod_dir):
                self._terminate(pod_dir)
            else:
                self._remove(pod_dir)

    def _start(self, pod_dir: Path, order: OrderedPod) -> None:
        pod_dir.mkdir(parents=True)
        env = {**self.base_env, **order.variables}
        if self.gpus:
            env[CUDA_VISIBLE_DEVICES] = ",".join(str(i) for i in order.slots)
        spec = {
            "name": order.name,
            "command": list(order.command),
            "env": env,
            "cwd": order.cwd or str(self.root),
            "memory": order.memory,
            "enforcement": self.enforcement.value,
            "grace_s": order.grace_s,
        }
        write_json(pod_dir / shim.SPEC, spec)
        write_json(pod_dir / ORDER, order.model_dump(mode="json"))
        proc = shim.start(pod_dir, self.python)
        self._started[order.name] = proc
        log.info("agent: started pod %s (pid %d, slots %s)", order.name, proc.pid, order.slots)

    @staticmethod
    def _uid(pod_dir: Path) -> str | None:
        ordered = read_json(pod_dir / ORDER) or {}
        uid = ordered.get("uid")
        return None if uid is None else str(uid)

    @staticmethod
    def _running(pod_dir: Path) -> bool:
        record = read_json(pod_dir / shim.PID)
        return record is not None and shim.alive(record)

    def kill_all(self) -> list[str]:
        """SIGKILL to every running pod's shim and everything below it (its command's
        process group, torchrun and its workers): nothing of them gets to say goodbye to
        the job's other pods. The pods' names."""
        killed = []
        for pod_dir in sorted(self.pods_dir.iterdir()):
            record = read_json(pod_dir / shim.PID)
            if record is None or not shim.alive(record):
                continue
            try:
                root = psutil.Process(int(record["pid"]))
                procs = [*root.children(recursive=True), root]
            except psutil.Error:
                continue
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            killed.append(pod_dir.name)
        return killed

    def _terminate(self, pod_dir: Path) -> None:
        """SIGTERM to the pod's shim (it passes it on and kills the rest after the grace
        period); repeating it is harmless, the shim acts on the first."""
        record = read_json(pod_dir / shim.PID)
        if record is not None and shim.alive(record):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(record["pid"]), signal.SIGTERM)

    def _remove(self, pod_dir: Path) -> None:
        """The pod goes, its log stays (``logs/<pod>.log``, added to when a name comes back)."""
        kept = self.logs_dir / f"{pod_dir.name}.log"
        with (
            contextlib.suppress(OSError),
            open(pod_dir / shim.LOG, "rb") as src,
            open(kept, "ab") as dst,
        ):
            shutil.copyfileobj(src, dst)
        shutil.rmtree(pod_dir, ignore_errors=True)
        log.info("agent: removed pod %s (its log: %s)", pod_dir.name, kept)

    # -- what they do ---------------------------------------------------------------------

    def states(self) -> list[AgentPod]:
        out = []
        for pod_dir in sorted(self.pods_dir.iterdir()):
            if (pod_dir / shim.SPEC).exists():
                out.append(self.state(pod_dir))
        return out

    @classmethod
    def state(cls, pod_dir: Path) -> AgentPod:
        """As its files say: ended (``exit.json``), running (its shim alive), or lost (its
        shim gone without a word: killed, and the pod's processes with it)."""
        record = read_json(pod_dir / shim.PID)
        pid = int(record["pid"]) if record is not None else None
        uid = cls._uid(pod_dir)
        ended = read_json(pod_dir / shim.EXIT)
        if ended is not None:
            code = int(ended["exitCode"])
            return AgentPod(
                name=pod_dir.name,
                uid=uid,
                phase="Succeeded" if code == 0 else "Failed",
                pid=pid,
                exit_code=max(-255, min(255, code)),
                reason=str(ended.get("reason") or ""),
                oom_kills=int(ended.get("oomKills") or 0),
            )
        if record is None:
            return AgentPod(name=pod_dir.name, uid=uid, phase="Pending")
        if not shim.alive(record):
            return AgentPod(
                name=pod_dir.name,
                uid=uid,
                phase="Failed",
                pid=pid,
                exit_code=255,
                reason="NodeLost",
            )
        oom = read_json(pod_dir / shim.OOM)
        return AgentPod(
            name=pod_dir.name,
            uid=uid,
            phase="Running",
            pid=pid,
            reason="OOMKilled" if oom else "",
            oom_kills=int(oom["oom_kills"]) if oom else 0,
        )


__all__ = ["CUDA_VISIBLE_DEVICES", "ORDER", "HostPods"]
