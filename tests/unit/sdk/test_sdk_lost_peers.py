"""A worker's decision to abandon its group when a peer's host is lost (issue 35):
``abandon`` (pure), what a job event says (``evidence_of``) and the watch acting once."""

from __future__ import annotations

from datetime import UTC, datetime

from dlrover_events.sdk.identity import JobIdentity
from dlrover_events.sdk.torch.lost_peers import (
    EXIT_PEER_LOST,
    NODE_LOST,
    SKEW_S,
    Group,
    Lost,
    LostPeerWatch,
    Member,
    abandon,
    evidence_of,
)
from dlrover_events.settings import Settings
from schemas.jobs import JobMeta, NodeExited, NodeFailed, NodeRef

FORMED = 1_000_000.0
ME = Member("worker", 0)
PEER = Member("worker", 2)
GROUP = Group(ME, frozenset({ME, Member("worker", 1), PEER}), FORMED)


def lost(member: Member, reason: str = NODE_LOST, at: float = FORMED + 6) -> Lost:
    return Lost(member, reason, at, f"job-{member.role}-{member.rank}")


def test_a_peer_of_the_group_declared_lost_after_it_formed_abandons_it() -> None:
    assert abandon(GROUP, [lost(PEER)]) == lost(PEER)
    # the first word that counts, whatever came before it
    assert abandon(GROUP, [lost(ME), lost(PEER, "Error"), lost(PEER)]) == lost(PEER)


def test_all_peers_alive_is_never_a_reason() -> None:
    assert abandon(GROUP, []) is None


def test_a_peer_that_failed_otherwise_is_left_to_the_collective() -> None:
    """Its processes ended and closed their connections: gloo fails the step at once."""
    for reason in ("Error", "OOMKilled", "Failed", "Evicted", ""):
        assert abandon(GROUP, [lost(PEER, reason)]) is None


def test_its_own_pod_declared_lost_is_not_this_workers_decision() -> None:
    assert abandon(GROUP, [lost(ME)]) is None


def test_a_pod_outside_the_group_blocks_nothing() -> None:
    """A pod that never joined (a replacement pending on a host lost in turn), or a pod
    of another role with a member's rank."""
    assert abandon(GROUP, [lost(Member("worker", 5))]) is None
    assert abandon(GROUP, [lost(Member("ps", 2))]) is None


def test_a_loss_said_before_the_group_formed_is_of_an_earlier_pod() -> None:
    """The member of that rank replaced the pod that was lost; within the clocks' skew
    the word still counts (the group's member may have been lost as it formed)."""
    assert abandon(GROUP, [lost(PEER, at=FORMED - SKEW_S - 0.5)]) is None
    assert abandon(GROUP, [lost(PEER, at=FORMED - SKEW_S + 0.5)]) == lost(
        PEER, at=FORMED - SKEW_S + 0.5
    )
    assert abandon(GROUP, [lost(PEER, at=FORMED - 10)], skew_s=11) is not None


def failed(job: str, rank: int, reason: str = NODE_LOST, role: str = "worker") -> NodeFailed:
    return NodeFailed(
        env="e",
        source="operator",
        job=JobMeta(uuid=job),
        node=NodeRef(type=role, id=rank, name=f"j-{role}-{rank}"),
        reason=reason,
        exit_code=255,
        occurred_at=datetime.fromtimestamp(FORMED + 5, UTC),
    )


def test_what_a_job_event_says() -> None:
    said = evidence_of(failed("uid", 2), "uid")
    assert said == Lost(PEER, NODE_LOST, FORMED + 5, "j-worker-2")
    assert evidence_of(failed("other", 2), "uid") is None
    exited = NodeExited(
        env="e", source="operator", job=JobMeta(uuid="uid"), node=NodeRef(type="worker", id=2)
    )
    assert evidence_of(exited, "uid") is None


def test_the_watch_ends_its_own_process_once_with_its_code() -> None:
    identity = JobIdentity(job=JobMeta(uuid="uid"), env="e", role="worker", rank=0)
    exits: list[int] = []
    said: list[Lost] = []
    watch = LostPeerWatch(
        identity, GROUP, Settings(), on_abandon=said.append, exit=exits.append
    )  # not started: no bus, the events are handed to it
    assert watch.consider(failed("other", 2)) is None
    assert watch.consider(failed("uid", 2, "Error")) is None
    assert watch.consider(failed("uid", 0)) is None  # its own pod
    assert exits == [] and said == []
    found = watch.consider(failed("uid", 2))
    assert found is not None and found.member == PEER
    assert exits == [EXIT_PEER_LOST] and said == [found]
    watch.consider(failed("uid", 1))
    assert exits == [EXIT_PEER_LOST], "it ends its process once"
