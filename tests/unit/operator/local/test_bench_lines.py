"""What bench elastic and the loop tests read of a pod's log: the workers' JSON lines, even
when the worker's stderr ran on after one on the same line (both go to the pod's log)."""

from __future__ import annotations

from pathlib import Path

from handlers.operator.local.bench import memberships


def test_a_worker_line_with_stderr_run_on_after_it_is_still_read(tmp_path: Path) -> None:
    log = tmp_path / "pods" / "job-worker-0" / "log"
    log.parent.mkdir(parents=True)
    log.write_text(
        '{"event": "membership", "time": 1.5, "world_size": 2}'
        "2026-11-27 10:00:00,000 WARNING dlrover_events.sdk.sender: broker away\n"
        "some other output\n"
        '{"event": "exit", "time": 2.0, "step": 40}\n'
    )
    assert memberships(tmp_path) == [
        {"event": "membership", "time": 1.5, "world_size": 2, "pod": "job-worker-0"},
        {"event": "exit", "time": 2.0, "step": 40, "pod": "job-worker-0"},
    ]
