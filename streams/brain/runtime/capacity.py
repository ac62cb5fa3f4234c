"""The platform's say in a cluster scheduler's rounds: which hosts, with how many GPUs.

A real env's operator reports its cluster on the compacted ``<env>.cluster.capacity``
(`schemas.cluster.CapacityReported`: a Node added, cordoned, NotReady or deleted; the
local platform's slots). Every brain of the env follows it from the beginning without a
consumer group and hands the latest report to its processor, whose rounds then give out
what the cluster has instead of the settings' static ``nodes`` x ``gpus_per_node`` (which
a virtual env, whose operator reports nothing, keeps using).

The report is a side input, not one of the decided topics: a capacity change takes effect
at the next round, whatever the event time, and a restarted brain reads the latest report
again rather than checkpointing it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiokafka import ConsumerRecord

from dlrover_events.bus.compacted import CompactedFollower
from dlrover_events.bus.topics import CLUSTER_CAPACITY, topic
from dlrover_events.lifecycle import AsyncResource, cancel_and_wait
from dlrover_events.settings import Settings
from schemas.cluster import CapacityReported
from schemas.codec import CodecError, check_env, decode

log = logging.getLogger(__name__)

#: How long a starting brain waits for the latest report before its first round.
CAPACITY_WAIT_S = 10.0


class CapacityFollower(AsyncResource):
    """Keeps handing the newest `CapacityReported` of one env to ``take``, in the background.

    ``caught_up`` returns once the reports present at ``start`` were read, so that a brain
    that waits for it does not schedule its first round on the static cluster while the
    platform's word is on the topic. A record that is not a report of this env is logged
    and skipped (the topic is the operator's, not the jobs')."""

    def __init__(
        self,
        settings: Settings,
        env: str,
        take: Callable[[CapacityReported], None],
        *,
        poll_ms: int = 200,
    ) -> None:
        self.env = env
        self.latest: CapacityReported | None = None
        self.rejected = 0
        self._take = take
        self._follower = CompactedFollower(
            settings,
            topic(env, CLUSTER_CAPACITY),
            self._handle,
            client_id="brain-capacity",
            poll_ms=poll_ms,
            require=False,
        )
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._follower.start()
        if not self._follower.exists:
            log.warning(
                "env %s has no %s topic (made before it existed; `env create` and `up` make "
                "it): its scheduler keeps the settings' cluster",
                self.env,
                CLUSTER_CAPACITY,
            )
            self._follower.caught_up.set()
            return
        self._stop.clear()
        self._task = asyncio.create_task(self._follow(), name=f"{self.env}.brain-capacity")

    async def stop(self) -> None:
        self._stop.set()
        await cancel_and_wait(self._task)
        self._task = None
        await self._follower.stop()

    async def caught_up(self, timeout_s: float) -> None:
        """Return once the reports on the topic at start were read (or ``timeout_s``
        passed: the static cluster is used until a report comes)."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._follower.caught_up.wait()
        except TimeoutError:
            log.warning(
                "env %s: the cluster's capacity was not read within %g s; scheduling on "
                "the settings' cluster until it is",
                self.env,
                timeout_s,
            )

    def _handle(self, records: list[ConsumerRecord]) -> None:
        for record in records:
            try:
                event = check_env(decode(record.value), self.env, record.topic)
            except CodecError as err:
                self.rejected += 1
                log.warning("%s offset %d skipped: %s", record.topic, record.offset, err.message)
                continue
            if not isinstance(event, CapacityReported):
                self.rejected += 1
                log.warning(
                    "%s offset %d skipped: a %s, not a capacity report",
                    record.topic,
                    record.offset,
                    event.type,
                )
                continue
            if self.latest is not None and event.occurred_at < self.latest.occurred_at:
                continue  # an older word (another operator replica's, reordered)
            self.latest = event
            log.info(
                "env %s: the %s platform reports %d schedulable GPUs on %d hosts",
                self.env,
                event.platform,
                event.gpus,
                len(event.hosts),
            )
            self._take(event)

    async def _follow(self) -> None:
        try:
            await self._follower.run(self._stop)
        except Exception:
            # Rounds go on with the last report read, rather than not at all.
            log.exception("stopped following the cluster capacity of env %r", self.env)


__all__ = ["CAPACITY_WAIT_S", "CapacityFollower"]
