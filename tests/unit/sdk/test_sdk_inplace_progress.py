"""A newcomer of an in-place group (a new pod, a warm spare admitted) takes the checkpoint's
progress from a member as a restore takes it from storage (``ElasticCheckpoint.progress``
and ``take_progress``): in three real gloo processes on this machine, a third member joins
two that trained with an ``ElasticSampler``, and its sampler goes on from their position,
not from the start of the data."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from tests.unit.sdk.members import run_members

REPO = Path(__file__).resolve().parents[3]
#: steps trained by all three after the newcomer joined
STEPS = 10
JOIN_AFTER = 8
GLOBAL_BATCH = 12  # divides over 2 and 3 ranks

MEMBER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    import torch
    from torch import nn
    from dlrover_events.sdk.torch import ElasticCheckpoint, ElasticSampler
    from dlrover_events.sdk.torch.inplace import InPlaceGroup, InPlaceSettings

    rank, port, root = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    steps, join_after, global_batch = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    go = root / "third-may-join"
    if rank == 2:  # the newcomer registers once the first two trained a while
        deadline = time.time() + 90
        while not go.exists() and time.time() < deadline:
            time.sleep(0.05)
    settings = InPlaceSettings(
        "127.0.0.1", port, hosts_store=rank == 0, expect=2, timeout_s=30, gather_s=0
    )
    group = InPlaceGroup(settings, member=f"m{rank}", handle_sigterm=False)
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    sampler = ElasticSampler(1200, global_batch, seed=1)
    ckpt = ElasticCheckpoint(
        root / "ck", model, optimizer, every=1000, sampler=sampler, handle_sigterm=False
    )
    group.join(model, optimizer, checkpoint=ckpt)
    joined = {"step": group.step, "position": sampler.position}
    # every member stops `steps` steps after the step the three formed at (the newcomer's
    # first): the same step for all, so none leaves the others mid-collective
    end = group.step + steps if group.world_size == 3 else None
    worlds, generation = [group.world_size], group.generation
    deadline = time.time() + 120
    while (end is None or group.step < end) and time.time() < deadline:
        group.boundary()
        if group.generation != generation:  # re-formed: check again before its first step,
            generation = group.generation  # as the newcomer does (train_elastic.py's loop)
            worlds.append(group.world_size)
            if group.world_size == 3 and end is None:
                end = group.step + steps
            continue
        before = group.step
        with group.stepping():
            x = torch.randn(len(sampler.local_batch()), 4)
            group.model(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        if group.step > before:
            sampler.advance()
        if rank == 0 and group.step >= join_after:
            go.touch()
        time.sleep(0.02)
    print(json.dumps({
        "rank": rank, "worlds": worlds, "step": group.step, "position": sampler.position,
        "joined": joined,
    }))
    group.close()
    """
)


def run_members_of(root: Path) -> dict[int, dict[str, Any]]:
    args = [str(root), str(STEPS), str(JOIN_AFTER), str(GLOBAL_BATCH)]
    return run_members(MEMBER, args, timeout_s=150)


def test_a_newcomer_goes_on_from_the_members_data_position(tmp_path: Path) -> None:
    outs = run_members_of(tmp_path)
    assert outs[0]["worlds"] == [2, 3], outs
    newcomer = outs[2]
    # it came in after the others trained, and took their step and sampler position
    assert newcomer["joined"]["step"] >= JOIN_AFTER, newcomer
    assert newcomer["joined"]["position"] == newcomer["joined"]["step"] * GLOBAL_BATCH
    # every member ends at the same step, each at the data position of that step
    final = {(o["step"], o["position"]) for o in outs.values()}
    assert final == {
        (newcomer["joined"]["step"] + STEPS, (newcomer["joined"]["step"] + STEPS) * GLOBAL_BATCH)
    }, outs
