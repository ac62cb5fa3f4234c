"""`job submit` on Kubernetes says when no operator would start the job: the operators'
Lease (leader election) released or no longer renewed, on the test's kube-apiserver.
Without a Lease it cannot tell, and submits (test_job_commands.py)."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

from dlrover_events.settings import Settings
from handlers.operator.kube.lease import DEFAULT_LEASE_NAME, LeaseRecord, Timing, released, taken

from .kube import GROUP, PLURAL, VERSION
from .test_job_commands import JobCli, job_file, one_line_error

pytestmark = pytest.mark.integration


async def test_job_submit_says_when_the_operators_lease_is_released_or_stale(
    api: client.ApiClient,
    kube: Path,
    namespace: str,
    trainingjob_crd: str,
    settings: Settings,
    pg_dsn: str,
    tmp_path: Path,
) -> None:
    leases = client.CoordinationV1Api(api)

    async def lease(spec: dict[str, Any]) -> None:
        """The Lease as an operator leaves it (written with lease.py's own helpers)."""
        with contextlib.suppress(ApiException):
            await leases.delete_namespaced_lease(DEFAULT_LEASE_NAME, namespace)
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": DEFAULT_LEASE_NAME},
            "spec": spec,
        }
        await leases.create_namespaced_lease(namespace, body)

    job = JobCli(settings, pg_dsn, kube, namespace)
    spec = job_file(tmp_path, "lease-job", 1)
    now = datetime.now(UTC)

    await lease(released(LeaseRecord("op-1", 15, 0, None, ""), now))  # a clean stop
    one_line_error(
        await job("submit", str(spec)),
        f"no operator holds the Lease {DEFAULT_LEASE_NAME} in namespace {namespace} (it was "
        "released)",
    )
    await lease(taken(None, "op-1", now - timedelta(minutes=10), Timing()))  # a crash
    one_line_error(await job("submit", str(spec)), "(it was last renewed 6")
    jobs = await client.CustomObjectsApi(api).list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL
    )
    assert jobs["items"] == [], "a refused job was created"

    await lease(taken(None, "op-1", datetime.now(UTC), Timing()))  # an operator leads
    done = await job("submit", str(spec))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"trainingjob {namespace}/lease-job created"

    await lease(released(LeaseRecord("op-1", 15, 1, None, ""), now))
    queued = job_file(tmp_path, "queued-job", 1)
    done = await job("submit", str(queued), "--queue")  # to wait for an operator
    assert done.returncode == 0, done.stderr
