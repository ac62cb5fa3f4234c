"""The boundary check of an in-place group, in three real gloo processes on this machine
(no agent, no platform): members that leave a little apart leave in one re-form within the
gather window, and two without it; with ``check_every`` > 1 a member asked to leave
between checks waits for the next one instead of starting a collective alone."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

from tests.unit.sdk.members import run_members

REPO = Path(__file__).resolve().parents[3]

MEMBER = textwrap.dedent(
    """
    import json, sys, threading, time
    import torch
    from torch import nn
    from dlrover_events.sdk.torch.inplace import InPlaceGroup, InPlaceSettings
    from schemas.jobs import JobMeta
    from schemas.plans import NodeGroupResource, ScalePlan

    rank, port, spec = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])

    def plan():
        # the job's plan as a member's follower has it, published just now
        if spec.get("plan_count") is None:
            return None
        wanted = {"worker": NodeGroupResource(count=spec["plan_count"])}
        return ScalePlan(env="it", job=JobMeta(uuid="j"), plan_id="p", node_group_resources=wanted)
    settings = InPlaceSettings(
        "127.0.0.1", port, hosts_store=rank == 0, expect=3, timeout_s=30,
        check_every=spec["check_every"], gather_s=spec["gather_s"],
    )
    group = InPlaceGroup(settings, member=f"m{rank}", handle_sigterm=False, plan=plan)
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    group.join(model, optimizer)
    worlds, leave = [group.world_size], spec["leave"].get(str(rank))
    while group.step < spec["steps"]:
        if leave is not None and group.step == leave[0]:
            # asked to leave at this step, or that many seconds after it (a SIGTERM that
            # comes while the group waits at the boundary)
            if leave[1]:
                threading.Timer(leave[1], group.request_leave).start()
            else:
                group.request_leave()
            leave = None
        group.boundary()
        if group.left:
            break
        if group.world_size != worlds[-1]:
            worlds.append(group.world_size)
        with group.stepping():
            group.model(torch.randn(8, 4)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        time.sleep(0.02)
    print(json.dumps({"rank": rank, "worlds": worlds, "left": group.left, "step": group.step}))
    group.close()
    """
)


def run_members_of(spec: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return run_members(MEMBER, [json.dumps(spec)], timeout_s=120)


def test_members_leaving_apart_within_the_window_leave_in_one_re_form() -> None:
    # rank 2 asks at step 5, rank 1 0.3 s later (some 10 steps on, had nobody waited)
    spec = {"check_every": 1, "gather_s": 1.5, "steps": 30, "leave": {"2": [5, 0], "1": [5, 0.3]}}
    outs = run_members_of(spec)
    assert outs[1]["left"] and outs[2]["left"]
    assert outs[0]["worlds"] == [3, 1] and outs[0]["step"] == 30


def test_within_the_window_the_plan_says_how_many_leave() -> None:
    # the plan asks for 2: rank 2 alone is the whole removal, nobody waits for rank 1,
    # whose leave is then a change of its own
    spec = {
        "check_every": 1,
        "gather_s": 1.5,
        "steps": 30,
        "leave": {"2": [5, 0], "1": [5, 0.3]},
        "plan_count": 2,
    }
    outs = run_members_of(spec)
    assert outs[1]["left"] and outs[2]["left"]
    assert outs[0]["worlds"] == [3, 2, 1]
    # the plan asks for 1: the window waits for rank 1 too
    outs = run_members_of({**spec, "plan_count": 1})
    assert outs[0]["worlds"] == [3, 1]


def test_without_the_window_they_leave_in_two_re_forms() -> None:
    spec = {"check_every": 1, "gather_s": 0, "steps": 30, "leave": {"2": [5, 0], "1": [5, 0.3]}}
    outs = run_members_of(spec)
    assert outs[1]["left"] and outs[2]["left"]
    assert outs[0]["worlds"] == [3, 2, 1]


def test_with_checks_every_other_step_a_leaver_waits_for_the_next_check() -> None:
    # asked at step 3, between checks (the checks come before steps 0, 2, 4, ...)
    spec = {"check_every": 2, "gather_s": 0.1, "steps": 20, "leave": {"2": [3, 0]}}
    outs = run_members_of(spec)
    assert outs[2]["left"] and outs[2]["step"] == 4
    assert outs[0]["worlds"] == [3, 2] and outs[1]["worlds"] == [3, 2]
    assert outs[0]["step"] == outs[1]["step"] == 20
