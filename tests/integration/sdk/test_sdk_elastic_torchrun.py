"""The elastic example under real torchrun agents (the SDK's dlrover-c10d rendezvous on
127.0.0.1): two nodes, a third joins (the workers re-rendezvous at world size 3), the
third is stopped and leaves the rendezvous (they go on at 2, long before its heartbeat
would have lapsed); the step count never goes back by more than the checkpoint interval,
and a plan's knobs switch every rank at the same step and survive each re-rendezvous.

Agents run with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with the shared TCPStore (torch's
default), a node joining a running job waits forever for the rank-0 address of its round
(torch reuses the first round's), and the scale-up never completes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dlrover_events.runtime.embedded import free_port
from dlrover_events.sdk.torch.rendezvous import BACKEND

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "elastic" / "train_elastic.py"
CHECKPOINT_EVERY = 10

pytestmark = pytest.mark.timeout(150)


@dataclass
class Agents:
    """torchrun agents of one job, their workers' JSON lines as they come."""

    tmp: Path
    backend: str = BACKEND
    port: int = field(default_factory=free_port)
    procs: dict[int, subprocess.Popen[str]] = field(default_factory=dict)
    lines: list[tuple[int, float, dict[str, Any]]] = field(default_factory=list)
    output: dict[int, list[str]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, node: int, *, host: bool) -> None:
        env = {
            **os.environ,
            "DLROVER_EVENTS_JOB_ID": "elastic-it",
            "DLROVER_EVENTS_RANK": str(node),
            "DLROVER_EVENTS_ENV": "it",
            "DLROVER_EVENTS_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",  # no broker
            "DLROVER_EVENTS_GATEWAY_URL": "",
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(REPO),
        }
        # A round closes 1 s after its last join (the default: 30 s). A stopped node
        # leaves the round itself; its heartbeat would lapse only after 3 missed 60 s ones,
        # longer than any wait here, so a plain c10d rendezvous never goes on without it.
        timeouts = "last_call_timeout=1,keep_alive_interval=60,keep_alive_max_attempt=3"
        conf = f"is_host={int(host)},{timeouts}"
        cmd = [
            str(REPO / ".venv" / "bin" / "torchrun"),
            "--nnodes=1:3",
            "--nproc-per-node=1",
            f"--rdzv-backend={self.backend}",
            f"--rdzv-endpoint=127.0.0.1:{self.port}",
            "--rdzv-id=elastic-it",
            f"--rdzv-conf={conf}",
            "--max-restarts=5",
            "--monitor-interval=0.5",
            "--no-python",
            str(REPO / ".venv" / "bin" / "python"),
            str(EXAMPLE),
            "--steps=100000",
            f"--checkpoint={self.tmp / 'elastic.pt'}",
            f"--checkpoint-every={CHECKPOINT_EVERY}",
            "--step-sleep-s=0.05",
            "--interval-s=1",
            "--batch-size=8",
            "--accumulation=3",
            "--knob-sync-every=5",
            "--simulate-plan=20:local_batch_size=4",
            "--close-timeout-s=0.3",
        ]
        proc = subprocess.Popen(
            cmd,
            cwd=self.tmp,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.procs[node] = proc
        self.output[node] = []
        threading.Thread(target=self._read, args=(node, proc), daemon=True).start()

    def _read(self, node: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.output[node].append(line)
            start = line.find("{")
            if start < 0:
                continue
            try:
                event = json.loads(line[start:])
            except ValueError:
                continue
            if isinstance(event, dict) and "event" in event:
                with self.lock:
                    self.lines.append((node, time.time(), event))

    def events(self, kind: str, since: float = 0.0) -> list[dict[str, Any]]:
        with self.lock:
            return [e for _, t, e in self.lines if e["event"] == kind and t >= since]

    def wait(self, what: str, cond: Callable[[], bool], timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        while not cond():
            if time.monotonic() > end:
                tail = {n: "".join(out[-15:]) for n, out in self.output.items()}
                raise AssertionError(f"timed out waiting for {what}; agents said: {tail}")
            time.sleep(0.1)

    def membership(self, world: int, since: float, timeout_s: float) -> list[dict[str, Any]]:
        def found() -> list[dict[str, Any]]:
            return [e for e in self.events("membership", since) if e["world_size"] == world]

        self.wait(
            f"{world} workers at world size {world}", lambda: len(found()) >= world, timeout_s
        )
        return found()

    def stop(self, node: int) -> None:
        proc = self.procs[node]
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def close(self) -> None:
        for node in list(self.procs):
            self.stop(node)


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Agents]:
    a = Agents(tmp_path)
    yield a
    a.close()


def last_step(exits: list[dict[str, Any]], world: int) -> int:
    return max(e["step"] for e in exits if e["world_size"] == world)


def test_workers_re_rendezvous_as_nodes_come_and_go(agents: Agents) -> None:
    t0 = time.time()
    agents.start(0, host=True)
    agents.start(1, host=False)
    two = agents.membership(2, t0, 40)
    assert {e["first_step"] for e in two} == {0}
    assert {e["node"] for e in two} == {0, 1}  # DLROVER_EVENTS_RANK, not torch's rank

    # The plan's knobs: every rank at the same step, the global batch (8 x 3 x 2) kept.
    agents.wait("the knobs switch", lambda: len(agents.events("knobs")) >= 2, 30)
    switches = agents.events("knobs")
    assert len({e["step"] for e in switches}) == 1
    # Rank 0 decided (and confirms); the other ranks got the numbers, not the plan.
    assert {e["plan_id"] for e in switches} == {"simulated-20", None}
    assert switches[0]["step"] >= 20 and switches[0]["step"] % 5 == 0
    assert {(e["local_batch_size"], e["accumulation_steps"]) for e in switches} == {(4, 6)}
    assert {e["global_batch"] for e in switches} == {48}

    time.sleep(1.0)
    t1 = time.time()
    agents.start(2, host=False)
    three = agents.membership(3, t1, 45)
    joined = max(e["time"] for e in three)
    assert len({e["first_step"] for e in three}) == 1
    resumed3 = three[0]["first_step"]
    before3 = last_step(agents.events("exit", t1), 2)
    assert before3 - CHECKPOINT_EVERY <= resumed3 <= before3
    # The knobs came back from the checkpoint, the accumulation keeping 48 at world 3.
    assert {(e["local_batch_size"], e["accumulation_steps"]) for e in three} == {(4, 4)}
    assert {e["node"] for e in three} == {0, 1, 2}

    time.sleep(1.5)
    t2 = time.time()
    agents.stop(2)
    again = agents.membership(2, t2, 45)
    resumed2 = again[0]["first_step"]
    assert len({e["first_step"] for e in again}) == 1
    before2 = last_step(agents.events("exit", t2), 3)
    assert before2 - CHECKPOINT_EVERY <= resumed2 <= before2
    assert resumed2 > resumed3  # it trained at world size 3
    assert {(e["local_batch_size"], e["accumulation_steps"]) for e in again} == {(4, 6)}
    assert not [e for e in agents.events("knobs", t1)]  # the plan was not applied again

    # each restarted worker said so after its first step: mode restart, the world it came
    # from (the checkpoint's), the phases a new process measures
    def restarted_lines() -> list[dict[str, Any]]:
        return [e for e in agents.events("rescaled", t2) if e["world_size"] == 2]

    agents.wait("the restarted workers' first steps", lambda: len(restarted_lines()) >= 2, 30)
    restarted = restarted_lines()
    assert {e["mode"] for e in restarted} == {"restart"}
    assert {e["world_size_before"] for e in restarted} == {3}
    assert all(e["reform_s"] > 0 and "first_step" in e["at"] for e in restarted)

    time.sleep(1.5)
    t3 = time.time()
    agents.close()
    final = agents.events("exit", t3)
    assert final and all(e["step"] > resumed2 for e in final)  # it went on at world size 2

    up_exit = max(e["time"] for e in agents.events("exit", t1) if e["time"] < joined)
    down_exit = max(e["time"] for e in agents.events("exit", t2) if e["world_size"] == 3)
    back = max(e["time"] for e in again)
    print(
        json.dumps(
            {
                # from starting the third agent / SIGTERM to it, to the first step at 3 / 2
                "scale_up_s": round(joined - t1, 2),
                "scale_down_s": round(back - t2, 2),
                # of which: until the last old worker exited, then until the new ones train
                "up_old_exited_s": round(up_exit - t1, 2),
                "up_new_training_s": round(joined - up_exit, 2),
                "down_old_exited_s": round(down_exit - t2, 2),
                "down_new_training_s": round(back - down_exit, 2),
                "worker_start_to_train_s": max(e["since_start_s"] for e in three + again),
                "steps_lost_up": before3 - resumed3,
                "steps_lost_down": before2 - resumed2,
                "total_s": round(time.time() - t0, 1),
            }
        )
    )
