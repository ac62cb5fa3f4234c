"""Two operator replicas on the real kube-apiserver, as two real processes of
`dlrover-events operator`, each as the operator's ServiceAccount under deploy/rbac: one
holds the Lease and applies plans, the other waits; the leader killed with SIGKILL (no
release), the other takes over once the lease went unrenewed, applies the plan published
meanwhile, and no plan is applied twice. A clean stop releases the lease.

Short lease durations (10 s lease, 7 s renew deadline, 0.5 s retry) keep it quick, and
the renew deadline long enough that the leader keeps its lease on a loaded machine (with
3 s, op-b lost it once in a CI run: a renewal the apiserver answered late); the only
time the test checks is a lower bound that load cannot break: the new leader took the
lease no sooner than a lease duration after the old one's last renewal.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]
from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry

from dlrover_events.bus.producer import Producer
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.settings import Settings
from handlers.operator.document.trainingjob import ANN_PLANS
from handlers.operator.kube.cluster import KubeCluster
from handlers.operator.kube.lease import DEFAULT_LEASE_NAME, LeaseElector, micro_time
from handlers.operator.kube.runner import RealOperator, kube_settings, run_elected
from schemas.control import EnvMode
from schemas.plans import NodeGroupResource, ScaleResult, ScaleStatus
from tests.conftest import EnvFactory, cli_environ
from tests.integration.tap import Tap

from .kube import FakeKubelet, server_of
from .test_kube_testenv import apply_rbac
from .test_reconciler_support import Cluster, KubeletLoop, role, until

pytestmark = pytest.mark.integration

LEASE_S = 10
RENEW_DEADLINE_S = 7
TIMING = {
    "DLROVER_EVENTS_OPERATOR_LEASE_DURATION_SECONDS": str(LEASE_S),
    "DLROVER_EVENTS_OPERATOR_RENEW_DEADLINE_SECONDS": str(RENEW_DEADLINE_S),
    "DLROVER_EVENTS_OPERATOR_RETRY_PERIOD_SECONDS": "0.5",
}
SA = "dlrover-events-operator"


async def sa_kubeconfig(api: client.ApiClient, namespace: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the operator's ServiceAccount (a TokenRequest
    token, as a pod of it gets mounted)."""
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
    got = await client.CoreV1Api(api).create_namespaced_service_account_token(
        SA, namespace, request
    )
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "t", "cluster": {"server": server_of(api), "insecure-skip-tls-verify": True}}
        ],
        "users": [{"name": SA, "user": {"token": got.status.token}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": SA}}],
        "current-context": "t",
    }
    await asyncio.to_thread(path.write_text, yaml.safe_dump(config))
    return path


class Replica:
    """One `dlrover-events operator` process; its stderr goes to a file."""

    def __init__(self, identity: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.identity = identity
        self.log = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(
            argv,
            env={**env, "DLROVER_EVENTS_OPERATOR_IDENTITY": identity},
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )

    def said(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> int:
        """SIGTERM, as a Deployment's rollout does; its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self._out.close()
        return self.proc.returncode


@pytest.fixture
def replicas() -> Iterator[list[Replica]]:
    running: list[Replica] = []
    yield running
    for r in running:
        with contextlib.suppress(Exception):
            r.stop()


@pytest.fixture
async def tap_of_real(settings: Settings, pg_dsn: str, make_env: EnvFactory) -> AsyncIterator[Tap]:
    """A tap on the session's real env (made if there is none), whose operator this is."""
    registry = EnvRegistry(settings, pg_dsn)
    real = await registry.real() or await make_env(mode=EnvMode.REAL)
    t = Tap(settings, real.name)
    await t.start()
    try:
        yield t
    finally:
        await t.stop()


async def lease(api: client.ApiClient, namespace: str) -> dict[str, Any] | None:
    resp: Any = await client.CoordinationV1Api(api).read_namespaced_lease(
        DEFAULT_LEASE_NAME, namespace, _preload_content=False
    )
    try:
        if resp.status == 404:
            return None
        got: dict[str, Any] = await resp.json()
        return got
    finally:
        resp.release()


async def holder_is(api: client.ApiClient, namespace: str, who: str) -> dict[str, Any] | None:
    got = await lease(api, namespace)
    if got is not None and (got.get("spec") or {}).get("holderIdentity") == who:
        return got
    return None


def when(micro_time: str) -> datetime:
    return datetime.fromisoformat(micro_time.replace("Z", "+00:00"))


def results(tap: Tap, plan_id: str) -> list[ScaleResult]:
    return [r for r in tap.of(ScaleResult) if r.plan_id == plan_id]


async def test_two_operators_one_lease_takeover_after_sigkill_applies_each_plan_once(
    settings: Settings,
    pg_dsn: str,
    api: client.ApiClient,
    trainingjob_crd: str,
    namespace: str,
    kubelet: FakeKubelet,
    tap_of_real: Tap,
    replicas: list[Replica],
    tmp_path: Path,
) -> None:
    tap = tap_of_real
    env = await EnvRegistry(settings, pg_dsn).real()
    assert env is not None
    await apply_rbac(api, namespace, "operator.yaml")
    kubeconfig = await sa_kubeconfig(api, namespace, tmp_path / "operator.kubeconfig")
    environ = {**cli_environ(settings, pg_dsn), **TIMING}
    environ.pop("KUBECONFIG", None)
    cli = str(Path(sys.executable).parent / "dlrover-events")
    argv = [cli, "operator", "--env", env.name, "--kubeconfig", str(kubeconfig), "-n", namespace]
    loop = KubeletLoop(kubelet, namespace)
    await loop.start()
    cluster = Cluster(settings, pg_dsn, api, namespace)
    try:
        a = Replica("op-a", argv, environ, tmp_path / "op-a.log")
        replicas.append(a)
        await until(lambda: holder_is(api, namespace, "op-a"), "op-a holding the lease")
        b = Replica("op-b", argv, environ, tmp_path / "op-b.log")
        replicas.append(b)

        async def b_waits() -> bool:
            return "is held by op-a: this operator waits" in b.said()

        await until(b_waits, f"op-b waiting for op-a's lease; it said: {b.said()!r}")

        name = await cluster.create_job({"worker": role(1)})
        await until(lambda: cluster.workers_running(name, 1), "the job's worker, made by op-a")
        meta = await cluster.meta(name)
        async with Producer(settings) as producer:
            grow = {"worker": NodeGroupResource(count=2)}
            await producer.publish(
                cluster.plan(env.name, meta, f"{name}-p1", node_group_resources=grow)
            )
            (first,) = await tap.until(lambda: results(tap, f"{name}-p1"), "p1's result")
            assert first.status is ScaleStatus.APPLIED, first.reason
            await until(lambda: cluster.workers_running(name, 2), "2 workers")
            assert "holds lease" not in b.said(), b.said()

            # The leader dies without a word: its lease stays until it expires.
            await asyncio.to_thread(a.kill)
            last = await lease(api, namespace)
            assert last is not None and last["spec"]["holderIdentity"] == "op-a"
            grow = {"worker": NodeGroupResource(count=3)}
            await producer.publish(
                cluster.plan(env.name, meta, f"{name}-p2", node_group_resources=grow)
            )
            taken = await until(lambda: holder_is(api, namespace, "op-b"), "op-b taking over")
            waited = when(taken["spec"]["acquireTime"]) - when(last["spec"]["renewTime"])
            assert waited.total_seconds() >= LEASE_S - 0.1, (last, taken)
            print(f"op-b took the lease {waited.total_seconds():.2f} s after op-a's last renewal")
            assert taken["spec"]["leaseTransitions"] == last["spec"].get("leaseTransitions", 0) + 1
            (second,) = await tap.until(lambda: results(tap, f"{name}-p2"), "p2's result (op-b)")
            assert second.status is ScaleStatus.APPLIED, second.reason
            await until(lambda: cluster.workers_running(name, 3), "3 workers")

            # p1 delivered again to the new leader: answered as before, not applied again.
            await producer.publish(
                cluster.plan(
                    env.name,
                    meta,
                    f"{name}-p1",
                    node_group_resources={"worker": NodeGroupResource(count=2)},
                )
            )
            await tap.until(lambda: len(results(tap, f"{name}-p1")) == 2, "p1 answered again")
        job = await cluster.job(name)
        assert job is not None and job.roles["worker"].replicas == 3
        obj = await cluster.kube.get_job(name)
        assert obj is not None
        applied = yaml.safe_load(obj["metadata"]["annotations"][ANN_PLANS])
        assert applied == [f"{name}-p1", f"{name}-p2"], applied
        assert len(await cluster.pods(name)) == 3
        said = b.said()
        assert "op-b holds lease" in said and "lost lease" not in said, said
        assert "Traceback" not in a.said() and "Traceback" not in said

        # A clean stop lets the lease go at once.
        assert await asyncio.to_thread(b.stop) == 0, b.said()
        got = await lease(api, namespace)
        assert got is not None and not got["spec"].get("holderIdentity"), got
        assert "op-b released lease" in b.said()
    finally:
        await loop.stop()


async def steal(api: client.ApiClient, namespace: str, holder: str | None) -> None:
    """What another replica's write would do: the lease to ``holder`` (None: released)."""
    leases = client.CoordinationV1Api(api)
    current = await lease(api, namespace)
    assert current is not None
    spec = dict(current["spec"])
    spec["holderIdentity"] = holder
    spec["leaseDurationSeconds"] = 3600 if holder else 1
    spec["renewTime"] = micro_time(datetime.now(UTC))
    body = {**current, "spec": {k: v for k, v in spec.items() if v is not None}}
    await leases.replace_namespaced_lease(DEFAULT_LEASE_NAME, namespace, body)


async def test_a_leader_that_loses_its_lease_stops_acting_at_once(
    settings: Settings,
    pg_dsn: str,
    api: client.ApiClient,
    cluster: Cluster,
    namespace: str,
    tap_of_real: Tap,
) -> None:
    tap = tap_of_real
    real = await EnvRegistry(settings, pg_dsn).real()
    assert real is not None
    conf = kube_settings(
        {
            "namespace": namespace,
            "lease_duration_seconds": LEASE_S,
            "renew_deadline_seconds": RENEW_DEADLINE_S,
            "retry_period_seconds": 0.5,
        }
    )
    leader = LeaseElector(api, namespace, identity="op-x", timing=conf.lease_timing())
    registry = CollectorRegistry(auto_describe=True)
    operator = RealOperator(
        settings,
        pg_dsn,
        KubeCluster(cluster.kube),
        env=real.name,
        conf=conf,
        leader=leader,
        metrics=registry,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(run_elected(operator, leader, stop))

    async def acting() -> bool:
        return operator.current is not None and operator.current.ready.is_set()

    try:
        await until(acting, "op-x acting as the leader")
        name = await cluster.create_job({"worker": role(1)})
        await until(lambda: cluster.workers_running(name, 1), "the job's worker")
        meta = await cluster.meta(name)

        await steal(api, namespace, "intruder")

        async def stopped() -> bool:
            return operator.current is None and not leader.held()

        await until(stopped, "op-x stopping once another replica holds the lease")
        async with Producer(settings) as producer:
            grow = {"worker": NodeGroupResource(count=2)}
            await producer.publish(
                cluster.plan(real.name, meta, f"{name}-p1", node_group_resources=grow)
            )
            # Not the leader: the plan waits. Whenever this look comes, it finds it unapplied.
            job = await cluster.job(name)
            assert job is not None and job.roles["worker"].replicas == 1
            assert results(tap, f"{name}-p1") == []
            back = datetime.now(UTC)
            await steal(api, namespace, None)  # the intruder lets go
            (result,) = await tap.until(lambda: results(tap, f"{name}-p1"), "p1's result")
        assert result.status is ScaleStatus.APPLIED, result.reason
        assert result.occurred_at >= back, "applied only once op-x held the lease again"
        await until(lambda: cluster.workers_running(name, 2), "2 workers")
        # The operator's metrics: the plan answered once, applied, with its latency.
        labels = {"env": real.name, "platform": "kubernetes"}
        get = registry.get_sample_value
        assert get("dlrover_events_operator_plans_total", {**labels, "status": "applied"}) == 1
        assert get("dlrover_events_operator_apply_duration_seconds_count", labels) == 1
    finally:
        stop.set()
        await asyncio.wait_for(task, 120)
