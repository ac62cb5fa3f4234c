"""The Kubernetes platform's `job` door (platform.registry): its TrainingJobs opened with the
user's own credentials, as kubectl does, and the check that an operator would reconcile a
job submitted now (the operators' Lease is held and renewed)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

from dlrover_events.errors import UserError
from dlrover_events.kube.credentials import connect as connect_user
from dlrover_events.settings import Settings
from handlers.operator.kube.client import KubeApi
from handlers.operator.kube.cluster import KubeCluster
from handlers.operator.kube.runner import KubeSettings, connect
from handlers.operator.kube.trainingjob import TRAINING_JOB
from handlers.operator.platform.api import Platform
from handlers.operator.platform.errors import Unavailable
from handlers.operator.platform.registry import ClusterOptions

#: How long past a Lease's duration its last renewal may lie before its holder is taken for
#: gone (the operator's clock and this one need not agree to the second).
LEASE_SLACK_S = 30.0


@contextlib.asynccontextmanager
async def open_jobs(
    settings: Settings, env: str, options: ClusterOptions
) -> AsyncIterator[Platform]:
    """The TrainingJobs of the cluster, with the user's own credentials (``kubeconfig``,
    else $KUBECONFIG, ~/.kube/config, else in-cluster, as kubectl) in ``namespace`` (else
    the context's). A cluster that cannot be reached is ``Unavailable``, saying where, in
    one line (the user's kubeconfig or network)."""
    api, namespace = await connect(
        KubeSettings(kubeconfig=options.kubeconfig, namespace=options.namespace)
    )
    async with api:
        cluster = KubeCluster(KubeApi(api, TRAINING_JOB, namespace))
        try:
            yield cluster
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise Unavailable(f"cannot reach the cluster at {cluster.host}: {why}") from None


async def check_operator(settings: Settings, env: str, options: ClusterOptions) -> None:
    """Refuse, in one line, a job that no operator would reconcile: the operators' Lease
    (leader election, on by default) is released, or no longer renewed. Without a Lease
    nothing can be told (an operator without leader election holds none), and a cluster
    that does not answer is left to the submission to say so."""
    name = KubeSettings().lease_name
    api, ns = await connect_user(
        options.kubeconfig, None, options.namespace, hint="pass --kubeconfig"
    )
    async with api:
        try:
            lease = await client.CoordinationV1Api(api).read_namespaced_lease(name, ns)
        except (ApiException, aiohttp.ClientError, OSError, TimeoutError):
            return
    spec = lease.spec
    holder = spec.holder_identity if spec is not None else None
    renewed = spec.renew_time if spec is not None else None
    duration = (spec.lease_duration_seconds if spec is not None else None) or 15
    if renewed is not None and renewed.tzinfo is None:
        renewed = renewed.replace(tzinfo=UTC)
    age = None if renewed is None else (datetime.now(UTC) - renewed).total_seconds()
    if holder and age is not None and age <= duration + LEASE_SLACK_S:
        return
    why = "was released" if not holder else f"was last renewed {age or 0:.0f}s ago"
    raise UserError(
        f"no operator holds the Lease {name} in namespace {ns} (it {why}), so nothing would "
        "start the job: start the operator, or pass --queue to create it now and let it wait"
    )


__all__ = ["LEASE_SLACK_S", "check_operator", "open_jobs"]
