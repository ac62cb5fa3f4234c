"""LostPeerWatch on the session's broker: it follows the job's events from when its group
formed and ends its process (here: says the exit code it would end it with) on the
operator's word that a peer of its group was lost, and on nothing else before it."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import JOB_EVENTS, topic
from dlrover_events.sdk.identity import JobIdentity
from dlrover_events.sdk.torch.lost_peers import (
    EXIT_PEER_LOST,
    NODE_LOST,
    Group,
    Lost,
    LostPeerWatch,
    Member,
)
from dlrover_events.settings import Settings
from schemas.codec import encode
from schemas.jobs import JobMeta, NodeFailed, NodeRef
from tests.conftest import EnvFactory

DEADLINE_S = 120.0


def failed(env: str, job: str, rank: int, reason: str, at: float) -> NodeFailed:
    return NodeFailed(
        env=env,
        source="operator",
        job=JobMeta(uuid=job),
        node=NodeRef(type="worker", id=rank, name=f"lost-worker-{rank}"),
        reason=reason,
        exit_code=255,
        occurred_at=datetime.fromtimestamp(at, UTC),
    )


async def test_the_watch_ends_its_worker_on_a_peer_declared_lost(
    settings: Settings, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    formed = time.time()
    me, peer = Member("worker", 0), Member("worker", 2)
    group = Group(me, frozenset({me, Member("worker", 1), peer}), formed)
    identity = JobIdentity(job=JobMeta(uuid="job-a"), env=env, role="worker", rank=0)
    ended = threading.Event()
    exits: list[int] = []
    said: list[Lost] = []

    def end(code: int) -> None:
        exits.append(code)
        ended.set()

    watch = LostPeerWatch(identity, group, settings, on_abandon=said.append, exit=end).start()
    try:
        # none of these is a reason: an earlier pod of the peer's rank (lost before the
        # group formed), another job's pod, its own pod, a peer that failed otherwise, a pod
        # outside the group; then the peer declared lost
        events = [
            failed(env, "job-a", 2, NODE_LOST, formed - 60),
            failed(env, "job-b", 2, NODE_LOST, formed + 1),
            failed(env, "job-a", 0, NODE_LOST, formed + 1),
            failed(env, "job-a", 2, "Error", formed + 1),
            failed(env, "job-a", 7, NODE_LOST, formed + 1),
            failed(env, "job-a", 2, NODE_LOST, formed + 2),
        ]
        async with Producer(settings) as producer:
            for event in events:
                assert event.key is not None
                await producer.send_raw(topic(env, JOB_EVENTS), encode(event), event.key.encode())
        got = await asyncio.to_thread(ended.wait, DEADLINE_S)
        assert got, f"the watch did not act within {DEADLINE_S:.0f}s"
        assert exits == [EXIT_PEER_LOST]
        # (the time as the event carries it: a datetime keeps microseconds, not every
        # digit of the float it was made from)
        at = events[-1].occurred_at.timestamp()
        assert [(s.member, s.reason, s.occurred_at) for s in said] == [(peer, NODE_LOST, at)]
    finally:
        watch.close()
