"""The operator as a service of `dlrover-events up` (entry point ``operator``).

`up` runs its services for the real env only, and this build has no real-cluster
reconciler: started by `up` the operator could only fail (the virtual one refuses the real
env) or sit idle while looking like it ran. So it is not started by default (in_up=False);
`dlrover-events operator --env E` runs it for a virtual env, and `up -s operator` says
plainly why it cannot run. Once the reconciler is in modes.RUNNERS, in_up becomes True.
"""

from __future__ import annotations

from dlrover_events.services import Service, ServiceContext
from handlers.operator.modes import run_operator


async def run(ctx: ServiceContext) -> None:
    await run_operator(ctx)


service = Service(
    name="operator",
    description="applies the env's ScalePlans (virtual env: simulated cluster and jobs)",
    run=run,
    in_up=False,
)
