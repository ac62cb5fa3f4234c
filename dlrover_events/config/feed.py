"""An env's config documents as ``<env>.config.changes`` announces them, for every reader.

The gateway serves documents from what it reads here and the brain routes jobs by them;
both read the topic the same way (``CompactedFollower``) and apply it the same way
(``Index.apply``), so they cannot disagree on what a job's documents say.

A record that is not a change of this env is logged, counted and skipped, not
dead-lettered: every gateway and every brain reads every record, so each would file the
same letter again; the gateway's store is the topic's only writer and validates first.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiokafka import ConsumerRecord

from dlrover_events.bus.compacted import CompactedFollower
from dlrover_events.bus.topics import CONFIG_CHANGES, topic
from dlrover_events.config.matching import Change
from dlrover_events.settings import Settings
from schemas.codec import CodecError, check_env, decode
from schemas.config import ConfigChange

log = logging.getLogger(__name__)

#: Takes a batch of changes in topic order (per name); returns how many changed anything.
Apply = Callable[[list[Change]], object]


def read_change(env: str, record: ConsumerRecord) -> Change | str:
    """A change, a tombstone ``(name, None)``, or why the record is not usable."""
    if record.value is None:
        if record.key is None:
            return "tombstone without a key"
        return (record.key.decode("utf-8", "replace"), None)
    try:
        event = check_env(decode(record.value), env, record.topic)
    except CodecError as err:
        return str(err)
    if not isinstance(event, ConfigChange):
        return f"a {event.type} event on the config topic"
    return event


class ConfigFeed(CompactedFollower):
    """Follows one env's config changes into ``apply``; ``rejected`` counts what was not."""

    def __init__(
        self,
        settings: Settings,
        env: str,
        apply: Apply,
        *,
        client_id: str,
        poll_ms: int = 100,
        caught_up: asyncio.Event | None = None,
    ) -> None:
        super().__init__(
            settings,
            topic(env, CONFIG_CHANGES),
            self._records,
            client_id=client_id,
            poll_ms=poll_ms,
            missing=f"is env {env!r} created? (`dlrover-events env list`)",
            caught_up=caught_up,
        )
        self.env = env
        self.rejected = 0
        self._apply = apply

    def _records(self, records: list[ConsumerRecord]) -> None:
        changes: list[Change] = []
        for r in records:
            got = read_change(self.env, r)
            if isinstance(got, str):
                self.rejected += 1
                log.warning("ignored %s[%d]@%d: %s", r.topic, r.partition, r.offset, got)
            else:
                changes.append(got)
        if changes:
            self._apply(changes)
