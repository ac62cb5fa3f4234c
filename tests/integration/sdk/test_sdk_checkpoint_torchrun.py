"""Checkpoints on real torch processes (issue 36): torchrun, gloo, CPU (checkpoint_job.py).

- FSDP2 (``fully_shard``) saves sharded, each rank its part, and resumes resharded 4 -> 2
  -> 4: the full model loaded is the one saved, bit for bit.
- DDP with the elastic sampler at a fixed global batch, resized 4 -> 2 -> 4, takes the
  same losses as a run never resized (float tolerance); both curves are printed.
- A job SIGKILLed in the middle of a persist (one rank's part written, the other's
  hanging) resumes from the previous complete checkpoint; a torn manifest is refused
  with one line.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dlrover_events.runtime.embedded import free_port
from dlrover_events.sdk.checkpoint_manifest import MANIFEST, step_dir
from dlrover_events.sdk.torch import list_checkpoints
from tests.conftest import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

JOB = REPO / "tests" / "integration" / "sdk" / "checkpoint_job.py"


def environ(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
        **(extra or {}),
    }


def command(nproc: int, *args: str) -> list[str]:
    if nproc == 1:
        return [sys.executable, str(JOB), *args]
    return [
        str(REPO / ".venv" / "bin" / "torchrun"),
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        f"--master-port={free_port()}",
        str(JOB),
        *args,
    ]


def lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def run(nproc: int, *args: str, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    done = subprocess.run(
        command(nproc, *args),
        capture_output=True,
        text=True,
        env=environ(env),
        cwd=REPO,
        timeout=240,  # torch's and DCP's imports alone take a minute on a loaded 2-core host
        check=False,
    )
    if done.returncode != 0:  # in full: pytest's assertion message cuts long strings
        pytest.fail(
            f"exit code {done.returncode}\n--- stdout, its end ---\n{done.stdout[-2000:]}"
            f"\n--- stderr, its end ---\n{done.stderr[-8000:]}"
        )
    return lines(done.stdout)


def one(events: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [e for e in events if e["event"] == kind]
    return found


def losses(events: list[dict[str, Any]]) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in events if e["event"] == "loss"}


def test_fsdp2_saves_sharded_and_resumes_resharded_4_2_4(tmp_path: Path) -> None:
    root = str(tmp_path / "fsdp")
    common = ["--mode=fsdp", f"--root={root}", "--every=100", "--width=32"]
    first = run(4, *common, "--until=3")
    assert one(first, "resumed")["step"] == 0
    saved = one(first, "exit")
    parts = sorted(p.name for p in (tmp_path / "fsdp" / step_dir(3)).glob("*.distcp"))
    assert parts == [f"__{r}_0.distcp" for r in range(4)]  # each rank wrote its own part
    (m,) = list_checkpoints(root)
    assert (m.step, m.world_size, m.sharded) == (3, 4, True)

    second = run(2, *common, "--until=6")
    back = one(second, "resumed")
    assert (back["step"], back["world_size"], back["saved_in"]) == (3, 2, 4)
    assert back["digest"] == saved["digest"]  # the full model, bit for bit, resharded
    again = one(second, "exit")
    assert again["step"] == 6 and again["digest"] != saved["digest"]  # and it trains on

    third = run(4, *common, "--until=8")
    back = one(third, "resumed")
    assert (back["step"], back["world_size"], back["saved_in"]) == (6, 4, 2)
    assert back["digest"] == again["digest"]
    assert [m.step for m in list_checkpoints(root)] == [8, 6, 3]


def test_ddp_resized_4_2_4_at_a_fixed_global_batch_takes_the_same_losses(tmp_path: Path) -> None:
    """The resized run's first part, 4 ranks from scratch to step 6, is the run never
    resized's: that run saves at step 6 as it trains on (a save behind training, its next
    optimizer step waiting for the copy), and the resized run goes on at 2 ranks from a
    copy of that checkpoint, then at 4 from the one its 2 ranks saved when they exited.
    (A separate 4-rank run to step 6 was one torchrun start more, a quarter of the test.)"""
    common = ["--mode=ddp", "--global-batch=8"]
    never_root, resized_root = tmp_path / "never", tmp_path / "resized"
    first = run(4, *common, "--every=6", f"--root={never_root}", "--until=18")
    assert one(first, "resumed")["step"] == 0
    never = losses(first)
    assert 6 in [m.step for m in list_checkpoints(str(never_root))]
    shutil.copytree(never_root / step_dir(6), resized_root / step_dir(6))
    resized = {step: loss for step, loss in never.items() if step <= 6}
    for nproc, until in ((2, 12), (4, 18)):
        events = run(nproc, *common, "--every=100", f"--root={resized_root}", f"--until={until}")
        assert one(events, "resumed")["step"] == until - 6
        resized.update(losses(events))
    print("\nstep  never resized (4)   resized 4 -> 2 -> 4")
    for step in sorted(never):
        print(f"{step:4d}  {never[step]:.9f}       {resized[step]:.9f}")
    assert sorted(resized) == sorted(never) == list(range(1, 19))
    assert [resized[s] for s in never] == pytest.approx(list(never.values()), rel=1e-5, abs=1e-7)
    assert never[18] < never[1] / 2  # it learns: the curves compared are not flat


def spawn(nproc: int, *args: str) -> list[subprocess.Popen[str]]:
    """The job's ranks as this test's own processes (torchrun starts its workers in
    sessions of their own): what a SIGKILL of the job kills."""
    port = str(free_port())
    return [
        subprocess.Popen(
            [sys.executable, str(JOB), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
            env=environ(
                {
                    "RANK": str(r),
                    "LOCAL_RANK": str(r),
                    "WORLD_SIZE": str(nproc),
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": port,
                }
            ),
        )
        for r in range(nproc)
    ]


def half_persisted(root: Path, since: int) -> Path | None:
    """A checkpoint directory from step ``since`` with rank 0's part and no manifest."""
    for folder in sorted(root.glob("step-*")):
        if int(folder.name.split("-")[1]) < since:
            continue
        if list(folder.glob("__0_*.distcp")) and not (folder / MANIFEST).exists():
            return folder
    return None


def test_a_job_killed_mid_persist_resumes_from_the_previous_checkpoint(tmp_path: Path) -> None:
    root = tmp_path / "job"
    args = [f"--root={root}", "--every=2", "--until=1000", "--step-sleep-s=0.05"]
    procs = spawn(2, *args, "--slow-rank=1", "--slow-step=4")
    try:
        # rank 0's part on disk, rank 1's write hanging: the persist is half done
        deadline = time.monotonic() + 180
        while (torn := half_persisted(root, 4)) is None:
            assert all(p.poll() is None for p in procs), procs[0].communicate()[0][-3000:]
            assert time.monotonic() < deadline, "no persist from step 4 began"
            time.sleep(0.05)
        complete = [m.step for m in list_checkpoints(root)]
        for p in procs:
            p.send_signal(signal.SIGKILL)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate(timeout=30)
    assert complete and complete[0] < 4 <= int(torn.name.split("-")[1])
    assert not (torn / MANIFEST).exists()

    events = run(2, f"--root={root}", "--every=100", "--until=5")
    assert one(events, "resumed")["step"] == complete[0]  # the half-done one passed over
    assert [m.step for m in list_checkpoints(root)] == [5, *complete]

    # a torn manifest: refused in one line naming the directory, no traceback
    manifest = root / step_dir(5) / MANIFEST
    manifest.write_bytes(manifest.read_bytes()[:60])
    done = subprocess.run(
        command(1, f"--root={root}", "--until=9"),
        capture_output=True,
        text=True,
        env=environ(),
        cwd=REPO,
        timeout=180,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    said = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(said) == 1 and "Traceback" not in done.stderr, done.stderr
    assert said[0].startswith(f"error: checkpoint {root / step_dir(5)} refused: its manifest")
