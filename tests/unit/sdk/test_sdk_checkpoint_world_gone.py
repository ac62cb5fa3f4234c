"""A save whose torch world is gone is given up, never committed. DCP called without an
initialised process group saves the calling rank's part alone, as if it were the whole
checkpoint: a worker whose store's host died destroyed its group and, as it exited,
waited for its persist's retry, which then committed a checkpoint of rank 1's part only
(no rank 0 progress, no rank 0 RNG); every restarted worker failed to load it
(test_sdk_inplace_torchrun's store host test, seen in CI). Two real gloo processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from dlrover_events.runtime.embedded import free_port
from dlrover_events.sdk.checkpoint_manifest import MANIFEST, step_dir
from dlrover_events.sdk.torch.checkpoint import list_checkpoints

REPO = Path(__file__).resolve().parents[3]

#: Both ranks start the save of step 2, whose directory a file blocks: the write fails
#: and is retried. Both then destroy their group (the world is gone), and only then is
#: the file removed: a retry now finds storage writable and no process group.
WORKER = textwrap.dedent(
    """
    import json, sys, time
    from datetime import timedelta
    from pathlib import Path
    import torch, torch.distributed as dist
    from torch import nn
    from dlrover_events.backoff import Backoff
    from dlrover_events.sdk.torch import ElasticCheckpoint
    rank, port, root, blocker = int(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
        timeout=timedelta(seconds=60),
    )
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    ck = ElasticCheckpoint(
        root, model, opt, every=2, handle_sigterm=False,
        backoff=Backoff(initial_s=0.05, max_s=0.2),
    )
    started = ck.maybe_save(2)
    end = time.monotonic() + 60
    while ck.persist_failures < 1 and time.monotonic() < end:
        time.sleep(0.02)
    failed = ck.persist_failures
    dist.barrier()
    dist.destroy_process_group()
    Path(f"{root}.rank{rank}-gone").touch()
    if rank == 0:
        end = time.monotonic() + 60
        while not Path(f"{root}.rank1-gone").exists() and time.monotonic() < end:
            time.sleep(0.02)
        blocker.unlink()
    ck.wait(60)
    line = {"rank": rank, "started": started, "failed": failed, "given_up": ck.given_up,
            "saved_step": ck.saved_step}
    print(json.dumps(line), flush=True)
    """
)


def test_a_save_whose_world_is_gone_is_given_up_not_committed_alone(tmp_path: Path) -> None:
    root = tmp_path / "job.pt"
    root.mkdir()
    blocker = root / step_dir(2)
    blocker.write_text("a file where the step's directory goes: the write fails")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(r), str(port), str(root), str(blocker)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        for r in (0, 1)
    ]
    lines = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
        lines.append(json.loads(out.strip().splitlines()[-1]))
    for line in lines:
        assert line["started"] is True and line["failed"] >= 1, line
        assert line["given_up"] == 1 and line["saved_step"] is None, line
    assert list_checkpoints(root) == []
    assert not (root / step_dir(2) / MANIFEST).exists()
