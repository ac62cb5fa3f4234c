"""Whether a starting agent may report under its host name: pure decisions, no I/O (the
agent reads the bus and its working directory, handlers.agent.agent).

Two live agents must never share a name: the operator would take one machine's reports for
the other's and count pods gone that run. The proof of life is a report younger than a few
heartbeats. A restarted agent must also be back on the bus before the operator's
``lost_after_s`` counts its host lost, so the check must not stand between a restart and
its first report: where this working directory's own agent reported under the name within
that window, no other agent can have taken the name since (its start would have found
this one's report young and been refused), and the bus need not be read at all. Otherwise
the reports are read from ``LOOKBACK_S`` back, those young enough to matter (a broker
that does not seek by time gives more to read and the same answer: the embedded tansu
started a seek 5 s into the future at the topic's first record).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from schemas.codec import CodecError, decode
from schemas.hosts import HostReported

#: A report younger than this many heartbeats (and at least ALIVE_S) means its agent is
#: alive: another machine's, where this working directory's last run is not its author.
ALIVE_HEARTBEATS = 3
ALIVE_S = 10.0
#: the longest heartbeat a report may declare (schemas.hosts.HostReported.heartbeat_s)
MAX_REPORTED_HEARTBEAT_S = 60.0
#: the reports a name check reads: those young enough to prove a live agent, plus a margin
#: for clocks (a report's age is judged by its author's clock, the broker's timestamp may
#: be the broker's)
LOOKBACK_S = ALIVE_HEARTBEATS * MAX_REPORTED_HEARTBEAT_S + 60.0


def alive_for(heartbeat_s: float) -> float:
    """How long a report of an agent beating every ``heartbeat_s`` proves it alive."""
    return max(ALIVE_S, ALIVE_HEARTBEATS * heartbeat_s)


def restarted_in_time(own: Mapping[str, Any] | None, host: str, now: float) -> bool:
    """Whether this working directory's last agent (its record, ``own``) reported under
    ``host`` recently enough that no other agent can have taken the name since: the bus
    need not be read. A record of another name, of no report, from the future (a clock
    set back) or unreadable says no."""
    if not own or own.get("host") != host:
        return False
    reported_at, heartbeat_s = own.get("reported_at"), own.get("heartbeat_s")
    if not isinstance(reported_at, int | float) or not isinstance(heartbeat_s, int | float):
        return False
    if isinstance(reported_at, bool) or isinstance(heartbeat_s, bool) or heartbeat_s <= 0:
        return False
    age = now - reported_at
    return 0 <= age < alive_for(heartbeat_s)


def latest_report(
    records: Iterable[tuple[bytes | None, bytes | None]], host: str
) -> HostReported | None:
    """The last report under ``host`` among (key, value) records in log order; records of
    other hosts, tombstones and what does not decode are passed over (the operator
    dead-letters garbage; here it proves nothing)."""
    mine = host.encode()
    latest: HostReported | None = None
    for key, value in records:
        if key != mine or value is None:
            continue
        try:
            event = decode(value)
        except CodecError:
            continue
        if isinstance(event, HostReported) and event.host == host:
            latest = event
    return latest


def name_taken(
    latest: HostReported | None, previous_agent_id: str | None, host: str, now: float
) -> str | None:
    """The one-line refusal when another live agent reports under ``host``, else None.
    ``latest``: the name's latest report; ``previous_agent_id``: this working
    directory's last agent (its own reports prove no one else)."""
    if latest is None or latest.agent_id == previous_agent_id:
        return None
    age = now - latest.occurred_at.timestamp()
    if age >= alive_for(latest.heartbeat_s):
        return None
    return (
        f"host name {host!r} is taken: another agent (at {latest.address}) reported under it "
        f"{max(age, 0.0):.1f} s ago; give this one its own (--host or DLROVER_EVENTS_AGENT_HOST)"
    )


__all__ = [
    "ALIVE_HEARTBEATS",
    "ALIVE_S",
    "LOOKBACK_S",
    "MAX_REPORTED_HEARTBEAT_S",
    "alive_for",
    "latest_report",
    "name_taken",
    "restarted_in_time",
]
