"""Where a job's checkpoint goes by default: the platform's directory, one file per job."""

from __future__ import annotations

from pathlib import Path

from dlrover_events.sdk.identity import CHECKPOINT_DIR_ENV, default_checkpoint_path


def test_a_job_checkpoints_to_its_own_file_in_the_platforms_directory() -> None:
    env = {CHECKPOINT_DIR_ENV: "/data/ckpt"}
    assert default_checkpoint_path("job-1", env) == Path("/data/ckpt/job-1.pt")
    assert default_checkpoint_path("a/../b", env) == Path("/data/ckpt/a_.._b.pt")
    assert default_checkpoint_path("job-1", {}) is None
