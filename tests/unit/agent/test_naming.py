"""Whether a starting agent may report under its host name (handlers.agent.naming): a
live other agent's report refuses it, its own predecessor's never does, a restart within
the proof-of-life window needs no reading of the bus, and anything else does."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from handlers.agent.naming import (
    ALIVE_S,
    LOOKBACK_S,
    MAX_REPORTED_HEARTBEAT_S,
    alive_for,
    latest_report,
    name_taken,
    restarted_in_time,
)
from schemas.codec import encode
from schemas.hosts import HostReported

NOW = 1_800_000_000.0


def report(
    host: str = "h1", agent_id: str = "other", age_s: float = 1.0, beat: float = 1.0
) -> HostReported:
    return HostReported(
        env="prod",
        host=host,
        agent_id=agent_id,
        address="10.0.0.9",
        heartbeat_s=beat,
        occurred_at=datetime.fromtimestamp(NOW - age_s, UTC),
    )


def own(
    host: str = "h1", age_s: float = 1.0, beat: float = 1.0, agent_id: str = "mine"
) -> dict[str, object]:
    return {"agent_id": agent_id, "host": host, "reported_at": NOW - age_s, "heartbeat_s": beat}


def test_the_lookback_covers_every_proof_of_life_a_report_may_give() -> None:
    field = HostReported.model_fields["heartbeat_s"]
    bound = next(m.le for m in field.metadata if getattr(m, "le", None) is not None)
    assert bound == MAX_REPORTED_HEARTBEAT_S
    assert alive_for(MAX_REPORTED_HEARTBEAT_S) < LOOKBACK_S


def test_a_live_other_agent_takes_the_name() -> None:
    refusal = name_taken(report(age_s=2.0), "mine", "h1", NOW)
    assert refusal is not None
    assert refusal.startswith("host name 'h1' is taken: another agent (at 10.0.0.9)")
    assert "\n" not in refusal


@pytest.mark.parametrize(
    ("latest", "previous"),
    [
        (None, None),  # no one ever reported under it
        (report(agent_id="mine", age_s=0.1), "mine"),  # this workdir's predecessor
        (report(age_s=ALIVE_S + 0.1), "mine"),  # long silent: dead
        (report(age_s=3 * 20.0 + 0.1, beat=20.0), None),  # silent past 3 of its heartbeats
    ],
)
def test_no_live_other_agent_leaves_the_name_free(
    latest: HostReported | None, previous: str | None
) -> None:
    assert name_taken(latest, previous, "h1", NOW) is None


def test_a_slow_heartbeat_proves_life_for_three_of_them() -> None:
    assert name_taken(report(age_s=3 * 20.0 - 1, beat=20.0), None, "h1", NOW) is not None


def test_the_latest_report_of_the_host_counts() -> None:
    records = [
        (b"h1", encode(report(agent_id="a", age_s=5))),
        (b"h2", encode(report(host="h2", agent_id="b", age_s=1))),
        (b"h1", b"{garbage"),
        (b"h1", encode(report(agent_id="c", age_s=3))),
        (b"h1", None),
        (None, encode(report(agent_id="d", age_s=1))),
    ]
    latest = latest_report(records, "h1")
    assert latest is not None and latest.agent_id == "c"
    assert latest_report(records, "h9") is None


def test_a_restart_in_time_needs_no_reading() -> None:
    assert restarted_in_time(own(age_s=0.4), "h1", NOW)
    assert restarted_in_time(own(age_s=ALIVE_S - 0.1), "h1", NOW)
    assert restarted_in_time(own(age_s=25.0, beat=10.0), "h1", NOW)


@pytest.mark.parametrize(
    "record",
    [
        None,
        {},
        {"agent_id": "mine", "host": "h1"},  # an agent of before: no time of its last report
        own(host="h2"),  # another name
        own(age_s=ALIVE_S + 0.1),  # too long ago: another may have taken the name since
        own(age_s=-5.0),  # from the future: the clock went back
        {**own(), "reported_at": "yesterday"},
        {**own(), "heartbeat_s": 0},
        {**own(), "reported_at": True},
    ],
)
def test_anything_else_reads_the_bus(record: dict[str, object] | None) -> None:
    assert not restarted_in_time(record, "h1", NOW)
