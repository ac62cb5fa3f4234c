"""A page that opens after an evaluator repeated itself learns how often (pure: the hub is
fed lines, no broker)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dlrover_events.bus.tail import Filter, read_line
from dlrover_events.settings import Settings
from handlers.console.hub import Hub, Repeat
from schemas.codec import encode
from schemas.evaluation import EvaluationReport

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def report(k: int) -> bytes:
    at = T0 + timedelta(seconds=10 * k)
    return encode(
        EvaluationReport(
            env="e",
            evaluator="gpu",
            window_start=at,
            window_end=at,
            occurred_at=at,
            metrics={"gpu_hours": 0.0},
        )
    )


def test_a_new_page_gets_the_report_once_and_its_repeats() -> None:
    hub = Hub(Settings(), "e", backlog_size=10)
    for k in range(4):
        hub.emit(read_line("e.eval.reports", 0, k, report(k)))
    hub.emit(read_line("e.job.events", 0, 0, b"garbage"))
    assert len(list(hub.recent())) == 2  # the report once, and the unreadable line
    sub = hub.subscribe(frozenset({"eval.reports"}), Filter(), backlog=10)
    got = [sub.queue.get_nowait() for _ in range(sub.queue.qsize())]
    assert [type(x).__name__ for x in got] == ["Line", "Repeat"]
    assert got[1] == Repeat("gpu", 3, (T0 + timedelta(seconds=30)).isoformat())
    assert hub.board.letters_seen == 1
    assert hub.board.letters[0]["kind"] == "unreadable"
