"""The operator as a service of `dlrover-events up` (entry point ``operator``).

`up` runs its services for the real env, whose operator is the Kubernetes reconciler
(handlers.operator.kube): it needs cluster credentials (DLROVER_EVENTS_OPERATOR_KUBECONFIG,
$KUBECONFIG, ~/.kube/config, or a pod's service account). The embedded stack of `make run`
has no cluster, so `up` does not start it by default (in_up=False): `up -s operator` runs
it where a cluster is at hand, and says plainly why it cannot run where none is.
DLROVER_EVENTS_OPERATOR_FOLLOW_REAL=1 makes it follow promotions of the real env.
"""

from __future__ import annotations

from dlrover_events.runtime.services import Service, ServiceContext
from handlers.operator.wiring.modes import run_operator


async def run(ctx: ServiceContext) -> None:
    await run_operator(ctx)


service = Service(
    name="operator",
    description="applies the env's ScalePlans (real env: pods on the cluster; virtual: simulated)",
    run=run,
    in_up=False,
)
