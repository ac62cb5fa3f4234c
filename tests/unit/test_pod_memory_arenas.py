"""A node under RLIMIT_AS gets glibc's malloc arenas capped (issue 35: under 4 GiB a
torch process could start 14 more threads, 102 with two arenas); a node's own setting
and the other enforcements are left alone. That the cap lets threads start is measured
by a real process under the limit."""

from __future__ import annotations

import resource
import subprocess
import sys

from dlrover_events.pods.memory import MALLOC_ARENAS, Enforcement, NodeMemory

GIB = 1 << 30
THREADS = """
import threading
n, ev = 0, threading.Event()
try:
    while n < 200:
        threading.Thread(target=ev.wait, daemon=True).start(); n += 1
except RuntimeError:
    pass
print(n)
"""


def test_rlimit_as_caps_the_arenas_unless_the_node_says() -> None:
    node = NodeMemory(Enforcement.RLIMIT_AS, 4 * GIB)
    assert node.child_env({"A": "1"}) == {"A": "1", "MALLOC_ARENA_MAX": MALLOC_ARENAS}
    assert node.child_env({"MALLOC_ARENA_MAX": "8"}) == {"MALLOC_ARENA_MAX": "8"}
    assert NodeMemory(Enforcement.NONE, None).child_env({"A": "1"}) == {"A": "1"}


def test_threads_start_under_the_limit_with_the_cap() -> None:
    node = NodeMemory(Enforcement.RLIMIT_AS, 1 * GIB)

    def started(env: dict[str, str]) -> int:
        done = subprocess.run(
            [sys.executable, "-c", THREADS],
            env=env,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (GIB, GIB)),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return int(done.stdout)

    assert started(node.child_env({})) > started({"MALLOC_ARENA_MAX": "64"})
