"""In-place membership, the pure part: the boundary check, the next generation after a
plan or a lost peer, the first generation (and the restart path's), what a rescale's
phases are; and StepKnobs.resize keeping the global batch in the new world."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover_events.runtime.embedded import free_port
from dlrover_events.sdk.knobs import BatchKnobs, StepKnobs
from dlrover_events.sdk.membership import (
    FROM_CHECKPOINT,
    Check,
    Decision,
    Joiner,
    MembershipError,
    Rescale,
    Survivor,
    check_vector,
    first_generation,
    gather_wait,
    plan_for,
    planned,
    read_check,
    recovered,
)
from schemas.jobs import JobMeta
from schemas.plans import NodeGroupResource, RescaleMode, ScalePlan

REPO = Path(__file__).resolve().parents[3]


def gen(members: list[str], *, generation: int = 3, admitted: int = 4) -> Decision:
    return Decision(generation, tuple(members), step=100, source=0, admitted=admitted)


def joiner(ticket: int, member: str, at: float = 10.0, restarts: int = 0) -> Joiner:
    return Joiner(ticket, member, at, pid=1000 + ticket, restarts=restarts)


@given(
    world=st.integers(1, 16),
    data=st.data(),
)
def test_the_boundary_check_combined_by_max_says_who_leaves_and_the_first_sign(
    world: int, data: st.DataObject
) -> None:
    leaving = data.draw(st.sets(st.integers(0, world - 1)))
    signs = {r: data.draw(st.floats(1e9, 2e9)) for r in leaving}
    newest = data.draw(st.integers(0, 1000))
    vectors = [
        check_vector(
            world,
            r,
            leaving=r in leaving,
            newest_ticket=newest if r == 0 else 0,
            sign_at=signs.get(r),
        )
        for r in range(world)
    ]
    combined = [max(column) for column in zip(*vectors, strict=True)]
    check = read_check(combined, world)
    assert check.leaving == frozenset(leaving)
    assert check.newest_ticket == newest
    if signs:
        assert check.sign_at == pytest.approx(min(signs.values()), abs=1e-3)
    else:
        assert check.sign_at is None


def test_a_check_of_another_world_is_refused() -> None:
    with pytest.raises(ValueError, match="slots"):
        read_check([0, 0, 0], 2)


def test_a_check_with_leavers_waits_until_the_gather_window_after_its_first_sign() -> None:
    leaving = Check(leaving=frozenset({2}), newest_ticket=0, sign_at=100.0)
    assert gather_wait(leaving, 100.03, 0.1) == pytest.approx(0.07)
    assert gather_wait(leaving, 100.5, 0.1) == 0.0  # the window passed: at once
    assert gather_wait(leaving, 90.0, 0.1) == 0.1  # a sign from a clock ahead: capped
    assert gather_wait(leaving, 100.03, 0.0) == 0.0  # no window
    # only leavers are gathered: a newcomer is admitted at once
    joining = Check(leaving=frozenset(), newest_ticket=5, sign_at=100.0)
    assert gather_wait(joining, 100.03, 0.1) == 0.0
    # the plan's replicas known: no wait once no more than those stay
    assert gather_wait(leaving, 100.03, 0.1, world_size=3, expected=2) == 0.0
    assert gather_wait(leaving, 100.03, 0.1, world_size=3, expected=1) == pytest.approx(0.07)


@given(
    sign=st.floats(0, 1e10),
    now=st.floats(0, 1e10),
    window=st.floats(0, 10),
)
def test_a_gather_wait_is_never_negative_nor_longer_than_the_window(
    sign: float, now: float, window: float
) -> None:
    wait = gather_wait(Check(frozenset({0}), 0, sign), now, window)
    assert 0.0 <= wait <= window
    assert wait == 0.0 or now + wait == pytest.approx(min(sign + window, now + window))


def test_a_leaver_goes_and_the_others_keep_their_order() -> None:
    current = gen(["a", "b", "c"])
    check = Check(leaving=frozenset({1}), newest_ticket=4, sign_at=12.0)
    nxt = planned(current, check, [], step=100)
    assert nxt is not None
    assert nxt.members == ("a", "c")
    assert (nxt.generation, nxt.step, nxt.world_before, nxt.joined) == (4, 100, 3, ())
    assert nxt.sign_at == 12.0


def test_newcomers_join_after_the_members_in_ticket_order() -> None:
    current = gen(["a", "b"], admitted=4)
    check = Check(leaving=frozenset(), newest_ticket=7, sign_at=11.0)
    waiting = [joiner(7, "z"), joiner(5, "x"), joiner(3, "old")]  # 3: dealt with before
    nxt = planned(current, check, waiting, step=100)
    assert nxt is not None
    assert nxt.members == ("a", "b", "x", "z")
    assert nxt.joined == ("x", "z")
    assert nxt.admitted == 7  # ticket 6 withdrew: dealt with too
    assert nxt.source == 0


def test_rank_0_leaving_makes_the_next_member_rank_0() -> None:
    nxt = planned(gen(["a", "b", "c"]), Check(frozenset({0}), 5, 1.0), [joiner(5, "d")], step=100)
    assert nxt is not None and nxt.members == ("b", "c", "d")


def test_everyone_leaving_leaves_no_generation() -> None:
    assert planned(gen(["a", "b"]), Check(frozenset({0, 1}), 4, 1.0), [], step=1) is None


def test_at_most_max_world_members_the_rest_wait() -> None:
    nxt = planned(
        gen(["a", "b"]),
        Check(frozenset(), 7, 1.0),
        [joiner(5, "x"), joiner(6, "y"), joiner(7, "z")],
        step=100,
        max_world=3,
    )
    assert nxt is not None and nxt.members == ("a", "b", "x")
    assert nxt.admitted == 5  # y and z stay waiting for a later boundary


def test_after_a_lost_peer_the_state_comes_from_the_survivor_with_the_most_steps() -> None:
    current = gen(["a", "b", "c", "d"])
    survivors = [Survivor("d", 3, 41), Survivor("a", 0, 40), Survivor("c", 2, 41)]
    nxt = recovered(current, survivors)
    assert nxt.members == ("a", "c", "d")
    assert nxt.step == 41
    assert nxt.members[nxt.source] == "c"  # the lowest old rank of those at 41
    assert (nxt.reason, nxt.world_before, nxt.generation) == ("peer lost", 4, 4)


def test_a_recovery_ignores_strangers_and_repeats() -> None:
    nxt = recovered(
        gen(["a", "b"]), [Survivor("b", 1, 9), Survivor("b", 1, 9), Survivor("x", 0, 50)]
    )
    assert nxt.members == ("b",) and nxt.step == 9
    with pytest.raises(ValueError, match="no survivor"):
        recovered(gen(["a"]), [Survivor("x", 0, 1)])


def test_the_first_generation_is_everyone_registered_from_the_checkpoint() -> None:
    first = first_generation([joiner(2, "b", 5.0), joiner(1, "a", 7.0)])
    assert first.members == ("a", "b")
    assert (first.generation, first.source, first.admitted) == (1, FROM_CHECKPOINT, 2)
    assert first.reason == "formed" and first.sign_at == 5.0
    again = first_generation([joiner(1, "a", restarts=1), joiner(2, "b")])
    assert again.reason == "restart"  # their agent restarted them: in place failed before


def test_records_round_trip_and_bad_ones_say_what_they_are() -> None:
    d = Decision(5, ("a", "b"), 7, 1, 9, reason="peer lost", sign_at=1.5, joined=("b",))
    assert Decision.decode(d.encode()) == d
    assert Joiner.decode(joiner(3, "x").encode()) == joiner(3, "x")
    assert Survivor.decode(Survivor("a", 1, 2).encode()) == Survivor("a", 1, 2)
    with pytest.raises(MembershipError, match="not JSON"):
        Decision.decode(b"{")
    with pytest.raises(MembershipError, match="without"):
        Joiner.decode(b'{"ticket": 1}')


def test_phases_are_the_spans_between_the_times_measured() -> None:
    r = Rescale(
        mode=RescaleMode.IN_PLACE,
        generation=2,
        world_before=2,
        world_size=3,
        rank=0,
        step=10,
        reason="1 joined",
        published_at=100.0,
        sign_at=100.5,
        agreed_at=100.75,
        group_at=101.0,
        state_at=101.25,
        ready_at=101.5,
        first_step_at=102.0,
    )
    p = r.phases()
    assert p.plan_delivery_s == 0.5
    assert p.agreement_s == 0.25
    assert p.reform_s == 0.5  # the group (0.25) and DDP after the state (0.25)
    assert p.state_transfer_s == 0.25
    assert p.first_step_s == 0.5
    assert p.total_s == 2.0
    r.published_at = None
    p = r.phases()
    assert p.plan_delivery_s is None and p.total_s == 1.5  # from the first sign
    assert r.as_line()["world_size"] == 3


def test_the_plan_of_a_rescale_is_the_one_asking_for_its_size() -> None:
    at = datetime(2030, 1, 1, tzinfo=UTC)
    plan = ScalePlan(
        env="prod",
        job=JobMeta(uuid="j"),
        plan_id="p-1",
        occurred_at=at,
        node_group_resources={"worker": NodeGroupResource(count=3)},
    )
    assert plan_for(plan, "worker", 3) == ("p-1", at.timestamp())
    assert plan_for(plan, "worker", 2) is None
    assert plan_for(plan, "ps", 3) is None
    assert plan_for(None, "worker", 3) is None


def test_knobs_resize_keeps_the_global_batch() -> None:
    def sync(v: list[int]) -> list[int]:
        return v

    knobs = StepKnobs(16, 1, world_size=2, rank=1, sync=sync, target_global_batch=64)
    assert knobs.knobs == BatchKnobs(16, 2)
    switch = knobs.resize(4, 3, sync, step=10)
    assert switch is not None and switch.step == 10
    assert knobs.knobs == BatchKnobs(16, 1) and (knobs.world_size, knobs.rank) == (4, 3)
    assert knobs.resize(4, 0, sync) is None  # same world: nothing switches
    knobs.resize(1, 0, None)
    assert knobs.knobs == BatchKnobs(16, 4) and knobs.global_batch == 64
    with pytest.raises(ValueError, match="sync"):
        knobs.resize(2, 0, None)


SYNC_WORKER = textwrap.dedent(
    """
    import sys
    from datetime import timedelta
    import torch, torch.distributed as dist
    from dlrover_events.sdk.torch.inplace_state import StateSync
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    store = dist.TCPStore("127.0.0.1", port, is_master=rank == 0, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    state = None
    if rank == 1:
        state = {"w": torch.arange(6.0).view(2, 3), "n": torch.tensor([7], dtype=torch.int64),
                 "nested": [{"m": torch.ones(2, dtype=torch.float16)}, ("text", 3)], "step": 41}
    got = StateSync(torch.device("cpu")).broadcast(state, 1)
    print(got["w"].sum().item(), got["n"].item(), got["nested"][0]["m"].dtype,
          got["nested"][1], got["step"], tuple(got["w"].shape), flush=True)
    dist.destroy_process_group()
    """
)


def test_state_goes_from_the_source_rank_to_every_rank() -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SYNC_WORKER, str(r), str(port)],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs[0] == outs[1] == "15.0 7 torch.float16 ('text', 3) 41 (2, 3)"
