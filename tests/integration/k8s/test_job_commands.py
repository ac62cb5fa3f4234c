"""`dlrover-events job submit/list/describe/scale/delete` as a user runs them against a
cluster: each command in its own process with a kubeconfig of the test's kube-apiserver,
its output, and its one-line errors (exit 2, `error: ...`, no traceback). The env's
reconciler runs meanwhile, so `scale` is seen through to the pods."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]

from dlrover_events.settings import Settings
from schemas.plans import ScaleResult, ScaleStatus
from tests.conftest import cli_environ
from tests.integration.tap import Tap

from .kube import GROUP, VERSION
from .test_elastic_jobs import elastic_worker
from .test_reconciler_support import Cluster, until

pytestmark = pytest.mark.integration


@pytest.fixture
async def tap(settings: Settings, env: str) -> AsyncIterator[Tap]:
    t = Tap(settings, env)
    await t.start()
    try:
        yield t
    finally:
        await t.stop()


class JobCli:
    def __init__(self, settings: Settings, pg_dsn: str, kubeconfig: Path, namespace: str) -> None:
        self.env = cli_environ(settings, pg_dsn)
        self.env.pop("KUBECONFIG", None)
        self.kubeconfig = kubeconfig
        self.namespace = namespace

    async def __call__(
        self, *args: str, kubeconfig: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """The command in its own process; the test's event loop (reconciler, kubelet)
        goes on meanwhile."""
        cli = str(Path(sys.executable).parent / "dlrover-events")
        where = ["--kubeconfig", str(kubeconfig or self.kubeconfig), "-n", self.namespace]
        return await asyncio.to_thread(
            subprocess.run,
            [cli, "job", *args, *where],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


def unreachable(kubeconfig: Path, path: Path) -> Path:
    """A copy of ``kubeconfig`` whose server is a closed port."""
    config = yaml.safe_load(kubeconfig.read_text())
    for c in config["clusters"]:
        c["cluster"]["server"] = "https://127.0.0.1:9"
    path.write_text(yaml.safe_dump(config))
    return path


def one_line_error(done: subprocess.CompletedProcess[str], says: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], lines


def job_file(tmp_path: Path, name: str, replicas: int, **labels: str) -> Path:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name, "labels": labels},
        "spec": {"roles": {"worker": elastic_worker(replicas)}},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


async def test_job_commands_against_the_cluster(
    cluster: Cluster,
    env: str,
    tap: Tap,
    kube: Path,
    settings: Settings,
    pg_dsn: str,
    tmp_path: Path,
) -> None:
    await cluster.start(env)
    job = JobCli(settings, pg_dsn, kube, cluster.namespace)
    spec = job_file(tmp_path, "cmd-job", 2, **{"dlrover-events.io/user": "alice"})

    done = await job("submit", str(spec))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"trainingjob {cluster.namespace}/cmd-job created"
    await until(lambda: cluster.workers_running("cmd-job", 2), "2 running workers")
    one_line_error(await job("submit", str(spec)), "already exists")

    async def listed() -> str | None:
        out = (await job("list")).stdout
        return out if "Running" in out and "worker=2/2" in out else None

    row = await until(listed, "the job listed Running with 2 of 2 workers")
    assert row.split()[0] == "cmd-job"

    described = await job("describe", "cmd-job")
    assert described.returncode == 0, described.stderr
    assert f"name:      {cluster.namespace}/cmd-job" in described.stdout
    assert "role worker: 2 replicas [1, 4]" in described.stdout
    assert "pod cmd-job-worker-0: Running" in described.stdout
    assert "pod cmd-job-worker-1: Running" in described.stdout
    one_line_error(await job("describe", "nope"), "no trainingjob 'nope'")

    scaled = await job("scale", "cmd-job", "--replicas", "3", "--env", env)
    assert scaled.returncode == 0, scaled.stderr
    plan_id = scaled.stdout.split()[1]
    assert f"published to {env}.scale.plans: cmd-job worker=3" in scaled.stdout
    result = await tap.first(
        ScaleResult,
        (await cluster.meta("cmd-job")).uuid,
        lambda r: r.plan_id == plan_id,
        "the scale's result",
    )
    assert result.status is ScaleStatus.APPLIED, result.reason
    await until(lambda: cluster.workers_running("cmd-job", 3), "3 running workers")
    one_line_error(
        await job("scale", "cmd-job", "--role", "ps", "--replicas", "2", "--env", env),
        "has no role 'ps'",
    )
    one_line_error(
        await job("scale", "nope", "--replicas", "2", "--env", env), "no trainingjob 'nope'"
    )

    deleted = await job("delete", "cmd-job")
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.strip() == "trainingjob cmd-job deleted"
    assert await cluster.kube.get_job("cmd-job") is None

    async def cleaned_up() -> bool:
        return not await cluster.all_pods("cmd-job")

    await until(cleaned_up, "the deleted job's pods gone")
    one_line_error(await job("delete", "cmd-job"), "no trainingjob 'cmd-job'")


async def test_job_command_mistakes_are_one_line_errors(
    kube: Path,
    namespace: str,
    trainingjob_crd: str,
    settings: Settings,
    pg_dsn: str,
    tmp_path: Path,
) -> None:
    job = JobCli(settings, pg_dsn, kube, namespace)
    bad = job_file(tmp_path, "bounds", 9)
    one_line_error(await job("submit", str(bad)), "above maxReplicas 4")
    bad.write_text("kind: [unclosed\n")
    one_line_error(await job("submit", str(bad)), "is not YAML")
    one_line_error(await job("list", kubeconfig=tmp_path / "missing"), "does not exist")

    # A cluster that does not answer: the kubeconfig's server is a closed port.
    away = unreachable(kube, tmp_path / "away.kubeconfig")
    one_line_error(await job("list", kubeconfig=away), "cannot reach the cluster")

    # The API server's own refusal, in its words: an invalid object (the schema's check).
    spec = job_file(tmp_path, "neg", 1)
    body = yaml.safe_load(spec.read_text())
    body["spec"]["roles"]["worker"]["restartPolicy"] = "Sometimes"
    spec.write_text(yaml.safe_dump(body))
    one_line_error(await job("submit", str(spec)), "422")
