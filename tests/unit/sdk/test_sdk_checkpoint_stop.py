"""A SIGTERM in a torch world stops every rank at the same step boundary, that step saved:
also a signal that lands just after a boundary's agreement, which a rank must not act on
alone (it would leave its peers in the next step's collectives and nobody would save).
Two real gloo processes on this machine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from torch import nn

from dlrover_events.runtime.embedded import free_port
from dlrover_events.sdk.torch import ElasticCheckpoint
from dlrover_events.sdk.torch.checkpoint import list_checkpoints

REPO = Path(__file__).resolve().parents[3]

#: A loop as the elastic example's: the step's collective, the boundary, the question.
#: Rank 0's SIGTERM arrives after the boundary of step 3 agreed (no stop then) and before
#: the loop asks ``should_stop``: where a signal sent during the agreement's all-reduce is
#: handled, as the call returns.
WORKER = textwrap.dedent(
    """
    import json, os, signal, sys
    from datetime import timedelta
    import torch, torch.distributed as dist
    from torch import nn
    from dlrover_events.sdk.torch import ElasticCheckpoint
    rank, port, root = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
        timeout=timedelta(seconds=60),
    )
    torch.manual_seed(0)
    ck = ElasticCheckpoint(root, nn.Linear(4, 2), every=1000)
    step, reason = 0, "done"
    try:
        while step < 10:
            dist.all_reduce(torch.ones(1))
            step += 1
            ck.maybe_save(step)
            if rank == 0 and step == 3:
                os.kill(os.getpid(), signal.SIGTERM)
            if ck.should_stop:
                reason = "sigterm"
                break
    except RuntimeError as err:
        reason = "peer_lost: " + str(err).splitlines()[0][:200]
    line = {"rank": rank, "reason": reason, "step": step, "saved_step": ck.saved_step,
            "stop_requested": ck.stop_requested}
    print(json.dumps(line), flush=True)
    if reason == "sigterm":
        dist.destroy_process_group()
    """
)


def test_a_sigterm_just_after_an_agreement_stops_both_ranks_at_the_next_boundary_saved(
    tmp_path: Path,
) -> None:
    root = tmp_path / "job.pt"
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(r), str(port), str(root)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        for r in (0, 1)
    ]
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        assert p.returncode == 0, err[-2000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    # Neither left at step 3 on rank 0's signal alone: both stopped at 4, and saved it.
    assert [(o["reason"], o["step"], o["saved_step"]) for o in outs] == [("sigterm", 4, 4)] * 2
    assert [o["stop_requested"] for o in outs] == [True, False]  # only rank 0 got it
    assert [m.step for m in list_checkpoints(root)] == [4]


def test_alone_a_sigterm_stops_at_once(tmp_path: Path) -> None:
    """Without peers there is nothing to agree with: the loop may leave before the next
    step (and save it at the boundary, as ``maybe_save`` does when stopping)."""
    torch.manual_seed(0)
    ck = ElasticCheckpoint(tmp_path / "job.pt", nn.Linear(4, 2), every=1000)
    try:
        assert not ck.should_stop and not ck.stop_requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert ck.stop_requested and ck.should_stop
        assert ck.maybe_save(5) and ck.saved_step == 5
    finally:
        ck.uninstall_sigterm_handler()
