"""Lockstep's barriers and acknowledgements share the job topics with job events: every
reader of those topics takes them in its stride, and none counts them as something a job did.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dlrover_events.bus.tail import Filter, format_text, read_line
from dlrover_events.settings import Settings
from handlers.console.board import Board
from handlers.console.hub import Hub
from schemas import encode
from schemas.jobs import JobCompleted, JobMeta, JobStarted, JobSubmitted
from schemas.lockstep import Barrier, BarrierAck
from streams.evaluators.ledger import Ledger
from streams.evaluators.registry import evaluate
from streams.replay.core import Selection

T0 = datetime(2026, 1, 1, tzinfo=UTC)
JOB = JobMeta(uuid="job-1", name="job-1", app="ncf")


def job_events() -> list[JobSubmitted | JobStarted | JobCompleted]:
    return [
        JobSubmitted(env="e", job=JOB, occurred_at=T0),
        JobStarted(env="e", job=JOB, occurred_at=T0 + timedelta(seconds=10)),
        JobCompleted(env="e", job=JOB, occurred_at=T0 + timedelta(seconds=100)),
    ]


def markers(tick: int = 4) -> tuple[Barrier, BarrierAck]:
    end = T0 + timedelta(seconds=120)
    return (
        Barrier(env="e", tick=tick, sim_at=end, occurred_at=end),
        BarrierAck(env="e", tick=tick, sim_at=end, occurred_at=end),
    )


def test_evaluators_do_not_count_a_barrier_as_something_a_job_did() -> None:
    plain, marked = Ledger(), Ledger()
    for event in job_events():
        plain.observe(event)
        marked.observe(event)
    for marker in markers():
        marked.observe(marker)
    assert marked.jobs.keys() == plain.jobs.keys() == {"job-1"}
    assert marked.last_event_at == plain.last_event_at == T0 + timedelta(seconds=100)
    assert evaluate(marked.in_window(None, None), marked.last_event_at) == evaluate(
        plain.in_window(None, None), plain.last_event_at
    )


def test_a_replay_never_copies_a_barrier_even_when_told_to_copy_everything() -> None:
    for selection in (Selection(), Selection(types=("*",), first_phase_only=False)):
        assert not any(selection.wants(m) for m in markers())
    assert Selection(types=("*",)).wants(job_events()[0])


def test_tail_shows_a_tick_in_one_line_and_can_filter_ticks_out() -> None:
    barrier, done = markers(7)
    text = format_text(read_line("e.job.metrics", 2, 9, encode(barrier)))
    assert "e.job.metrics[2]@9" in text
    assert "sim.barrier" in text and "tick=7 ends 2026-01-01T00:02:00+00:00" in text
    assert "tick=7 decided" in format_text(read_line("e.scale.plans", 0, 1, encode(done)))
    assert not Filter(type_pattern="job.*").accepts(barrier)


def test_the_console_board_has_no_job_for_a_barrier() -> None:
    board = Board()
    for marker in markers():
        board.apply(marker)
    assert board.snapshot() == []


def test_the_console_feed_keeps_no_markers() -> None:
    """A lockstep env ticks on every partition: markers would push the jobs' events out of
    a page's backlog."""
    hub = Hub(Settings(), "e", backlog_size=3)
    job = JobMeta(uuid="j")
    lines = [
        read_line("e.job.events", 0, 0, encode(JobStarted(env="e", job=job, occurred_at=T0))),
        *(
            read_line("e.job.events", 0, 1 + t, encode(Barrier(env="e", tick=t + 1, sim_at=T0)))
            for t in range(5)
        ),
        read_line("e.scale.plans", 0, 0, encode(BarrierAck(env="e", tick=1, sim_at=T0))),
    ]
    for line in lines:
        hub.emit(line)
    assert [type(line.event) for line in hub.recent()] == [JobStarted]
