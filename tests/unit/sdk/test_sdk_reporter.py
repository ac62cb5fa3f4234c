"""Buffering and drop accounting with no broker to talk to (nothing listens on the port).

The live broker, its outage and its return are in tests/integration/sdk.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dlrover_events.runtime.embedded import free_port
from dlrover_events.sdk import JobIdentity, Reporter
from dlrover_events.settings import Settings
from schemas.jobs import JobMeta, NodeOOM, NodeRef, OOMKind


def identity(job: str = "job-unit") -> JobIdentity:
    return JobIdentity(job=JobMeta(uuid=job), env="unit", role="worker", rank=2)


def nowhere() -> Settings:
    return Settings(bootstrap_servers=f"127.0.0.1:{free_port()}")


@pytest.fixture
def reporter() -> Iterator[Reporter]:
    r = Reporter(
        identity(),
        settings=nowhere(),
        interval_s=0.01,
        buffer_size=3,
        send_timeout_s=0.5,
        retry_backoff_max_s=0.05,
        probes=[],
    )
    yield r
    r.close(timeout_s=0.2)


def run_until(reporter: Reporter, samples: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while reporter.stats().samples < samples:
        assert time.monotonic() < deadline, reporter.stats()
        reporter.step(samples=8)
        time.sleep(0.001)


def test_full_buffer_drops_and_counts(reporter: Reporter, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dlrover_events.sdk")
    reporter.start()
    run_until(reporter, 12)
    running = reporter.stats()
    assert running.pending <= 3
    assert running.dropped >= running.samples - 3 - 1  # the thread may be mid-cut
    assert running.published == 0 and not running.connected
    assert running.last_error is not None

    final = reporter.close(timeout_s=0.2)
    assert final.published == 0 and final.pending == 0
    assert final.dropped == final.queued == final.samples >= 12
    assert reporter.dropped == final.dropped
    summary = [r for r in caplog.records if "reporter closed" in r.getMessage()]
    assert len(summary) == 1
    assert summary[0].levelno == logging.WARNING
    assert f"{final.dropped} dropped" in summary[0].getMessage()
    assert any("unreachable since" in r.getMessage() for r in caplog.records)


def test_steps_never_raise_before_start_or_after_close(reporter: Reporter) -> None:
    for _ in range(100_000):  # more than the step deque holds
        reporter.step()
    reporter.start()
    final = reporter.close(timeout_s=0.2)
    reporter.step(samples=1)
    # The deque kept the newest records; the rest cost precision, not steps.
    assert final.steps == 100_000
    assert final.step_records_lost == 100_000 - 16_384
    assert final.samples == 1


def test_flush_with_the_bus_down_returns_false_without_raising(reporter: Reporter) -> None:
    reporter.start()
    for _ in range(10):
        reporter.step()
        time.sleep(0.002)
    assert reporter.flush(timeout_s=0.3) is False


def test_publish_after_close_is_refused_and_counted(reporter: Reporter) -> None:
    reporter.start()
    stats = reporter.close(timeout_s=0.2)
    oom = NodeOOM(
        env="unit",
        job=JobMeta(uuid="job-unit"),
        node=NodeRef(type="worker", id=2),
        kind=OOMKind.HOST_MEMORY,
    )
    reporter.publish(oom)
    assert reporter.dropped == stats.dropped + 1


def test_queued_events_of_a_reporter_never_started_are_dropped(reporter: Reporter) -> None:
    oom = NodeOOM(
        env="unit",
        job=JobMeta(uuid="job-unit"),
        node=NodeRef(type="worker", id=2),
        kind=OOMKind.GPU_MEMORY,
    )
    reporter.publish(oom)
    stats = reporter.close(timeout_s=0.1)
    assert (stats.queued, stats.dropped, stats.pending) == (1, 1, 0)


def test_track_marks_one_step_per_item(reporter: Reporter) -> None:
    seen = list(reporter.track(range(7), samples=4))
    assert seen == list(range(7))
    assert reporter.stats().steps == 7


def test_a_failing_probe_is_disabled_and_samples_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = 0

    def broken() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        raise OSError("no /proc here")

    r = Reporter(identity(), settings=nowhere(), interval_s=0.01, probes=[broken])
    r.start()
    try:
        run_until(r, 3)
    finally:
        r.close(timeout_s=0.1)
    assert calls == 1
    assert any("probe" in rec.getMessage() for rec in caplog.records)


def test_unreachable_gateway_leaves_defaults_and_does_not_raise() -> None:
    r = Reporter(
        identity(),
        settings=nowhere(),
        gateway_url=f"http://127.0.0.1:{free_port()}",
        config_timeout_s=0.5,
    )
    r.start()
    try:
        assert r.config is not None
        assert r.config.stale and r.config.error
        assert r.config.config == {}
    finally:
        r.close(timeout_s=0.1)


@pytest.mark.parametrize(
    "kwargs", [{"buffer_size": 0}, {"max_batch": 0}, {"step_buffer": 1}, {"interval_s": 0.0}]
)
def test_nonsense_sizes_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="must be"):
        Reporter(identity(), settings=nowhere(), **kwargs)
