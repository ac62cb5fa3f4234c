"""A worker that ends itself when a peer of its group is lost with its host (restart path).

A peer that dies on a machine that is still up closes its connections, and gloo fails the
others' collective at once (``is_peer_failure``). A peer whose host is lost (its link cut,
the machine gone) says nothing: the others sit in their collective until the process
group's timeout (60 s in the example) before torchrun's agents re-form the job without it.
The platform knows sooner: the operator declares the host lost after its reports stop
(the hosts platform: ``DLROVER_EVENTS_HOSTS_LOST_AFTER_S``) and says so on the job's events
(``node.failed``, reason ``NodeLost``, for each of its pods).

``LostPeerWatch`` follows the job's events from a thread of its own. When one says that a
pod of this worker's current group (another than this one) was lost after the group
formed, the worker ends its own process with ``EXIT_PEER_LOST`` (the main thread may be
blocked in a collective that would never return), and torchrun's agent restarts its
worker group into the next rendezvous, at the smaller size, from the last checkpoint. It
never acts on another process, never on slowness (only the operator's word that a pod is
lost counts), and never on its own pod's loss (the agent and the operator deal with a pod
cut off). The decision is ``abandon``, pure; the group is the pods that trained in this
process's torch world (``gather_group``: one all-gather when the watch starts).

For the restart path only: an in-place role's group (``inplace``) re-forms itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from dlrover_events.bus.topic_reader import TopicReader
from dlrover_events.bus.topics import JOB_EVENTS, topic
from dlrover_events.sdk import quiet
from dlrover_events.sdk.identity import JobIdentity
from dlrover_events.settings import Settings
from schemas.codec import CodecError, decode
from schemas.envelope import Event
from schemas.jobs import NodeFailed

log = logging.getLogger(__name__)

#: The exit code of a worker that ended itself because a peer of its group was lost: any
#: failure makes torchrun's agent restart the worker group; this one says why.
EXIT_PEER_LOST = 4
#: The reason the operator gives a pod of a host it declared lost.
NODE_LOST = "NodeLost"
#: Seconds of clock difference allowed between the operator's host, which stamps the
#: event, and this one, which says when the group formed.
SKEW_S = 2.0
#: Seconds between two tries to reach the bus, at most.
RETRY_MAX_S = 5.0


@dataclass(frozen=True, order=True)
class Member:
    """A pod of the job, as the platform names it: its role and its rank (node id)."""

    role: str
    rank: int


@dataclass(frozen=True)
class Group:
    """This worker's current group: ``me``, every pod in it (``me`` among them), and when
    it formed (wall clock, seconds; no later than this process's start)."""

    me: Member
    members: frozenset[Member]
    formed_at: float


@dataclass(frozen=True)
class Lost:
    """What the platform said of a pod: ``reason`` (``NodeLost`` for a lost host) at
    ``occurred_at`` (the operator's clock)."""

    member: Member
    reason: str
    occurred_at: float
    pod: str = ""


def abandon(group: Group, evidence: Iterable[Lost], skew_s: float = SKEW_S) -> Lost | None:
    """The word that a peer of ``group`` is gone for good (None: carry on).

    Only a pod declared lost counts (a peer that merely failed closed its connections, and
    the collective already failed), only a peer of this group (a pod that never joined it
    blocks nothing), never this worker's own pod, and only a loss said after the group
    formed (less ``skew_s`` for the clocks): an earlier one is of a pod of the same rank
    that the group's member replaced."""
    for lost in evidence:
        if lost.reason != NODE_LOST:
            continue
        if lost.member == group.me or lost.member not in group.members:
            continue
        if lost.occurred_at < group.formed_at - skew_s:
            continue
        return lost
    return None


def evidence_of(event: Event, job: str) -> Lost | None:
    """What ``event`` says of a pod of ``job`` (its uuid), None when nothing."""
    if not isinstance(event, NodeFailed) or event.job.uuid != job:
        return None
    return Lost(
        Member(event.node.type, int(event.node.id)),
        event.reason,
        event.occurred_at.timestamp(),
        event.node.name,
    )


def gather_group(identity: JobIdentity, formed_at: float) -> Group:
    """Every pod of this process's torch world (one all-gather of each one's role and
    rank; call it where every rank does, after the process group is initialised)."""
    import torch.distributed as dist

    me = Member(identity.role, identity.rank)
    everyone: list[tuple[str, int] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (me.role, me.rank))
    members = frozenset(Member(str(m[0]), int(m[1])) for m in everyone if m is not None)
    return Group(me, members | {me}, formed_at)


def _end_process(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


class LostPeerWatch:
    """Follows the job's events (``<env>.job.events``) in a daemon thread and ends this
    process (``exit``, default ``os._exit``) with ``EXIT_PEER_LOST`` once ``abandon``
    says so; ``on_abandon`` runs first (a last line, say; what it raises is logged). The
    bus unreachable only delays the word: it is retried, quietly."""

    def __init__(
        self,
        identity: JobIdentity,
        group: Group,
        settings: Settings,
        *,
        on_abandon: Callable[[Lost], object] | None = None,
        exit: Callable[[int], object] = _end_process,
        skew_s: float = SKEW_S,
    ) -> None:
        self.identity = identity
        self.group = group
        self.skew_s = skew_s
        self.lost: Lost | None = None
        self._settings = settings
        self._on_abandon = on_abandon
        self._exit = exit
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lost-peers", daemon=True)

    @classmethod
    def for_world(
        cls,
        identity: JobIdentity,
        *,
        formed_at: float | None = None,
        settings: Settings | None = None,
        on_abandon: Callable[[Lost], object] | None = None,
    ) -> LostPeerWatch | None:
        """Started for this process's torch world (``gather_group``); None alone or where
        the bus's settings are invalid (the watch is then what it was without it)."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return None
        group = gather_group(identity, time.time() if formed_at is None else formed_at)
        if settings is None:
            from dlrover_events.errors import UserError
            from dlrover_events.settings import load_settings

            try:
                settings = load_settings()
            except UserError as err:
                log.warning("lost peers not followed: %s", err)
                return None
        return cls(identity, group, settings, on_abandon=on_abandon).start()

    def start(self) -> LostPeerWatch:
        self._thread.start()
        return self

    def close(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def consider(self, event: Event) -> Lost | None:
        """One event of the job's: abandons the group (ends the process) when it says a
        peer was lost; returns what it found."""
        lost = evidence_of(event, self.identity.job.uuid)
        found = abandon(self.group, [lost], self.skew_s) if lost is not None else None
        if found is None or self.lost is not None:
            return found
        self.lost = found
        log.warning(
            "a peer of this group was lost (%s %d, pod %s: %s); ending this worker (exit %d) "
            "so its agent re-forms the job without it",
            found.member.role,
            found.member.rank,
            found.pod or "?",
            found.reason,
            EXIT_PEER_LOST,
        )
        if self._on_abandon is not None:
            try:
                self._on_abandon(found)
            except Exception:
                log.exception("lost peers: on_abandon failed")
        self._stop.set()
        self._exit(EXIT_PEER_LOST)
        return found

    def _run(self) -> None:
        # aiokafka's lines of a bus away are kept out of the training's log, as the
        # reporter's are (dlrover_events.sdk.quiet)
        try:
            quiet_kafka = quiet.kafka_logs_quiet()
        except ValueError:  # the reporter says so
            quiet_kafka = False
        if quiet_kafka:
            quiet.install()
            quiet.KAFKA_FILTER.register(threading.get_ident())
        try:
            asyncio.run(self._follow())
        except Exception:
            log.exception("lost peers: the watch ended")
        finally:
            if quiet_kafka:
                quiet.KAFKA_FILTER.unregister(threading.get_ident())

    async def _follow(self) -> None:
        name = topic(self.identity.env, JOB_EVENTS)
        begin = datetime.fromtimestamp(self.group.formed_at - self.skew_s, UTC)
        job = self.identity.job.uuid.encode()
        failures = 0
        while not self._stop.is_set():
            try:
                reader = TopicReader(
                    self._settings, [name], client_id="lost-peers", begin=begin, require=False
                )
                async with reader:
                    failures = 0
                    while not reader.partitions and not self._stop.is_set():
                        await asyncio.sleep(0.5)
                        if await reader.refresh():
                            await reader.seek(begin)
                    while not self._stop.is_set():
                        for record in await reader.fetch(timeout_ms=500):
                            if record.key is not None and record.key != job:
                                continue
                            try:
                                event = decode(record.value)
                            except CodecError:
                                continue
                            self.consider(event)
                            if self._stop.is_set():
                                return
            except Exception as err:
                failures += 1
                log.debug("lost peers: cannot read %s: %r", name, err)
                await asyncio.sleep(min(RETRY_MAX_S, 0.5 * failures))


__all__ = [
    "EXIT_PEER_LOST",
    "NODE_LOST",
    "SKEW_S",
    "Group",
    "Lost",
    "LostPeerWatch",
    "Member",
    "abandon",
    "evidence_of",
    "gather_group",
]
