"""`dlrover-events job ... --platform local` as a user runs it: each command in its own
process, its output and its one-line errors (exit 2, no traceback)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml  # type: ignore[import-untyped,unused-ignore]

from handlers.operator.platform.bodies import JobView
from tests.conftest import cli_environ
from tests.integration.local.conftest import Local
from tests.integration.local.test_local_platform import sleeper_job


def job_cli(local: Local, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **cli_environ(local.settings, local.pg_dsn),
        "DLROVER_EVENTS_DATA_DIR": str(local.settings.data_dir),
    }
    cli = str(Path(sys.executable).parent / "dlrover-events")
    return subprocess.run(
        [cli, "job", *args, "--platform", "local", "--env", local.env],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def one_line_error(done: subprocess.CompletedProcess[str], says: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], lines


async def test_job_commands_on_the_local_platform(local: Local, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(sleeper_job("cmd-job", 2)))
    done = job_cli(local, "submit", str(spec), "--queue", cwd=tmp_path)  # no operator runs
    assert done.returncode == 0, done.stderr
    assert "trainingjob default/cmd-job created" in done.stdout
    obj = await local.cluster().get_job("cmd-job")
    assert isinstance(obj, JobView)
    assert obj.document["metadata"]["annotations"]["dlrover-events.io/workdir"] == str(tmp_path)

    one_line_error(job_cli(local, "submit", str(spec), "--queue", cwd=tmp_path), "already exists")

    listed = job_cli(local, "list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "cmd-job" in listed.stdout and "worker=0/2" in listed.stdout

    described = job_cli(local, "describe", "cmd-job", cwd=tmp_path)
    assert described.returncode == 0, described.stderr
    assert "role worker: 2 replicas [1, 4]" in described.stdout
    one_line_error(job_cli(local, "describe", "nope", cwd=tmp_path), "no trainingjob 'nope'")

    one_line_error(
        job_cli(local, "scale", "cmd-job", "--role", "ps", "--replicas", "2", cwd=tmp_path),
        "has no role 'ps'",
    )

    deleted = job_cli(local, "delete", "cmd-job", cwd=tmp_path)
    assert deleted.returncode == 0, deleted.stderr
    assert await local.cluster().get_job("cmd-job") is None
    one_line_error(job_cli(local, "delete", "cmd-job", cwd=tmp_path), "no trainingjob")


async def test_bad_job_files_are_one_line_errors(local: Local, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [unclosed\n")
    one_line_error(job_cli(local, "submit", str(bad), cwd=tmp_path), "is not YAML")
    bad.write_text(yaml.safe_dump({"kind": "Deployment"}))
    one_line_error(job_cli(local, "submit", str(bad), cwd=tmp_path), "must hold one TrainingJob")
    body = sleeper_job("Bad_Name", 1)
    bad.write_text(yaml.safe_dump(body))
    # --queue: the name is the platform's to refuse, past the check that an operator runs
    bad_name = job_cli(local, "submit", str(bad), "--queue", cwd=tmp_path)
    one_line_error(bad_name, "must be a DNS label")
    body = sleeper_job("bounds", 9)
    bad.write_text(yaml.safe_dump(body))
    one_line_error(job_cli(local, "submit", str(bad), cwd=tmp_path), "above maxReplicas 4")
