"""The bounded drop buffer on its own: the oldest sample goes first, never an OOM."""

from __future__ import annotations

import logging

import pytest

from dlrover_events.sdk.buffer import DropBuffer
from schemas.jobs import JobMeta, NodeOOM, NodeRef, OOMKind, RuntimeSample

JOB = JobMeta(uuid="j")


def sample(step: int) -> RuntimeSample:
    return RuntimeSample(env="prod", job=JOB, source="t", global_step=step, speed=1.0)


def oom() -> NodeOOM:
    return NodeOOM(
        env="prod", job=JOB, source="t", kind=OOMKind.HOST_MEMORY, node=NodeRef(type="worker", id=0)
    )


def test_a_full_buffer_drops_the_oldest_sample_and_keeps_the_oom(
    caplog: pytest.LogCaptureFixture,
) -> None:
    buffer = DropBuffer(3, "j", lambda: "KafkaConnectionError")
    first = oom()
    buffer.add(first)
    for step in range(1, 6):
        buffer.add(sample(step))
    assert len(buffer) == 3 and buffer.queued == 6 and buffer.dropped == 3
    kept = buffer.take(10)
    assert kept[0] is first
    assert [e.global_step for e in kept[1:]] == [4, 5]  # type: ignore[attr-defined]
    # Logged once, not once per drop.
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert lines == [
        "dlrover-events: dropped 1 events so far for job j "
        "(buffer of 3 events full; last error: KafkaConnectionError)"
    ]


def test_requeue_puts_a_batch_back_in_front_in_order_and_counts_it_once() -> None:
    buffer = DropBuffer(10, "j", lambda: None)
    for step in range(1, 5):
        buffer.add(sample(step))
    batch = buffer.take(2)
    buffer.requeue(batch)
    assert [e.global_step for e in buffer.take(10)] == [1, 2, 3, 4]  # type: ignore[attr-defined]
    assert buffer.queued == 4 and buffer.dropped == 0


def test_discard_counts_what_is_left_and_outage_counts_restart() -> None:
    buffer = DropBuffer(2, "j", lambda: None)
    for step in range(1, 4):
        buffer.add(sample(step))
    assert buffer.dropped_in_outage == 1
    buffer.outage_started()
    assert buffer.discard("still unsent at close") == 2
    assert (buffer.dropped, buffer.dropped_in_outage, len(buffer)) == (3, 2, 0)
